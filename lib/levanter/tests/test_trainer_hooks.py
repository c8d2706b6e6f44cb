"""The trainer's hooks (which run after which step, in which order) and its throughput meter."""

import logging
import math
import re

import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.hooks import AtLastStep, Hook, StepInfo, due_hooks, run_hooks
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.throughput import ThroughputMeter
from levanter.trainer.tracker import read_metrics


def _steps_run(hook: Hook, last_step: int) -> list[int]:
    return [step for step in range(1, last_step + 1) if hook.due(step, last_step)]


def _ignore(info):
    pass


# -- scheduling ---------------------------------------------------------------------------------


def test_every_three_over_ten_steps_runs_at_multiples_of_three():
    assert _steps_run(Hook("h", _ignore, every=3), last_step=10) == [3, 6, 9]


def test_a_hook_that_always_runs_at_the_end_adds_the_last_step():
    assert _steps_run(Hook("h", _ignore, every=3, at_last=AtLastStep.ALWAYS), last_step=10) == [3, 6, 9, 10]
    # Not twice when the last step is a multiple anyway.
    assert _steps_run(Hook("h", _ignore, every=5, at_last=AtLastStep.ALWAYS), last_step=10) == [5, 10]


def test_a_hook_that_never_runs_at_the_end_skips_a_last_step_that_is_due():
    assert _steps_run(Hook("h", _ignore, every=5, at_last=AtLastStep.NEVER), last_step=10) == [5]


def test_every_none_or_zero_runs_only_at_the_end_if_asked():
    for every in (None, 0):
        assert _steps_run(Hook("h", _ignore, every=every), last_step=10) == []
        assert _steps_run(Hook("h", _ignore, every=every, at_last=AtLastStep.ALWAYS), last_step=10) == [10]


def test_every_one_is_every_step():
    assert _steps_run(Hook("h", _ignore), last_step=4) == [1, 2, 3, 4]


def test_a_condition_besides_the_step_count_also_makes_a_hook_due():
    hook = Hook("h", _ignore, every=4, when=lambda step: step == 7, at_last=AtLastStep.NEVER)
    assert _steps_run(hook, last_step=10) == [4, 7, 8]
    # At the last step the at_last policy wins over the condition.
    assert _steps_run(Hook("h", _ignore, every=None, when=lambda step: True, at_last=AtLastStep.NEVER), 3) == [1, 2]


def test_due_hooks_run_in_the_order_declared():
    ran = []
    hooks = [
        Hook("log", lambda info: ran.append(("log", info.step))),
        Hook("checkpoint", lambda info: ran.append(("checkpoint", info.step)), every=2, at_last=AtLastStep.NEVER),
        Hook("eval", lambda info: ran.append(("eval", info.step)), every=3, at_last=AtLastStep.ALWAYS),
    ]
    for step in range(1, 7):
        run_hooks(due_hooks(hooks, step, last_step=6), StepInfo(step, {}))
    assert ran == [
        ("log", 1),
        ("log", 2), ("checkpoint", 2),
        ("log", 3), ("eval", 3),
        ("log", 4), ("checkpoint", 4),
        ("log", 5),
        ("log", 6), ("eval", 6),
    ]  # fmt: skip


# -- the trainer's own schedule -----------------------------------------------------------------

VOCAB, SEQ, BATCH = 64, 16, 8


def test_trainer_logs_evaluates_and_checkpoints_at_the_steps_its_config_names(tmp_path, caplog):
    config = TrainerConfig(
        num_train_steps=10, batch_size=BATCH, log_every=3, eval_every=4, steps_per_checkpoint=5,
        checkpoint_at_end=False, keep_last_checkpoints=None, mesh=MeshConfig(data=1),
    )  # fmt: skip
    seen = []
    trainer = Trainer(
        config, AdamConfig(3e-3, 0.1, warmup=2), output_dir=str(tmp_path),
        hooks=[lambda trainer, step, metrics: seen.append(step)],
    )  # fmt: skip
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=BATCH, seed=3)
    model = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
    evals = {"held_out": lambda: [next(iter(source.iter_from(0)))]}
    with caplog.at_level(logging.INFO, logger="levanter.trainer"):
        result = trainer.train(lambda key: model.build(VOCAB, key=key), source, evals)

    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    train_lines = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_lines] == list(range(1, 11))  # metrics.jsonl: every step
    assert [r["tokens"] for r in train_lines] == [step * BATCH * SEQ for step in range(1, 11)]
    assert [r["step"] for r in records if "eval/held_out/loss" in r] == [4, 8, 10]  # every 4, and the end
    assert result.checkpoint_steps == [5]  # every 5, but not the end: checkpoint_at_end=False
    progress = [int(m) for m in re.findall(r"step (\d+)/10 ", caplog.text)]
    assert progress == [3, 6, 9, 10]  # every 3, and the end
    assert seen == list(range(1, 11))  # the caller's hooks: every step, in order
    # A step's eval line comes after its train line.
    train_4 = next(i for i, r in enumerate(records) if r["step"] == 4 and "loss" in r)
    eval_4 = next(i for i, r in enumerate(records) if r["step"] == 4 and "eval/held_out/loss" in r)
    assert train_4 < eval_4


def test_published_weights_arrive_before_the_batch_that_needs_them_and_batch_metrics_join_the_line(tmp_path):
    """A source that makes batch k only once it holds the weights after step k (as an on-policy RL
    sampler does) runs to the end: each publication comes before the next batch is fetched."""
    import threading

    import jax

    from levanter.data.batch import Batch
    from levanter.trainer.hooks import ModelEvaluation, ModelPublisher

    published: dict[int, float] = {}
    arrived = threading.Condition()

    def publish(model, step):
        with arrived:
            published[step] = float(np.asarray(jax.tree.leaves(model)[0]).sum())  # a copy: the buffers are reused
            arrived.notify_all()

    class WaitsForWeights:
        def iter_from(self, start):
            windows = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=BATCH, seed=1)
            for k in range(start, 6):
                with arrived:
                    assert arrived.wait_for(lambda: k in published, timeout=60), f"no weights of step {k}"
                batch = windows.batch_at(k)
                yield Batch(batch.tokens, batch.loss_mask, metrics={"made_with_weights_of": float(k)})

    config = TrainerConfig(num_train_steps=6, batch_size=BATCH, checkpoint_at_end=False, mesh=MeshConfig(data=1))
    evaluated = []
    trainer = Trainer(config, AdamConfig(3e-3), output_dir=str(tmp_path),
                      model_publishers=[ModelPublisher("weights", publish, every=1)],
                      model_evaluations=[ModelEvaluation("probe", lambda model, step: evaluated.append(step) or {"x": 1.0},
                                                         every=3, at_start=True)])
    model = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
    trainer.train(lambda key: model.build(VOCAB, key=key), WaitsForWeights())
    assert sorted(published) == [0, 1, 2, 3, 4, 5]  # at the start, then after each step but the last
    assert len(set(published.values())) == 6  # each step's own weights
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["made_with_weights_of"] for r in records if "loss" in r] == [0, 1, 2, 3, 4, 5]
    assert evaluated == [0, 3, 6] and records[0] == {"step": 0, "probe/x": 1.0}  # the starting weights, first


def test_batch_extras_must_be_shaped_like_the_tokens():
    from levanter.data.batch import Batch

    tokens = np.zeros((2, 4), np.int32)
    with pytest.raises(ValueError, match=r"Batch.extras\['advantages'\] shape \(2,\) != tokens shape \(2, 4\)"):
        Batch(tokens, np.ones((2, 4), np.float32), extras={"advantages": np.zeros(2)})


# -- throughput ---------------------------------------------------------------------------------


def _meter(*, started=100.0, tokens_per_step=1000, completed_steps=0, flops_per_token=None, peak=None, devices=1):
    meter = ThroughputMeter(started, num_devices=devices, peak_flops_per_device=peak)
    meter.set_batch(tokens_per_step, completed_steps=completed_steps, flops_per_token=flops_per_token)
    return meter


def test_each_step_is_timed_from_the_previous_read():
    meter = _meter()
    first = meter.step(104.0)  # 4 s, compilation included
    second = meter.step(104.5)
    assert (first.tokens, first.tokens_per_second, first.wall_time) == (1000, 250.0, 4.0)
    assert (second.tokens, second.tokens_per_second, second.wall_time) == (2000, 2000.0, 4.5)


def test_a_resumed_run_counts_the_tokens_of_the_steps_before_it():
    assert _meter(completed_steps=7).step(101.0).tokens == 8000


def test_time_before_a_restarted_clock_is_not_a_steps_time():
    meter = _meter()
    meter.step(101.0)
    meter.restart_clock(130.0)  # an evaluation took 29 s
    assert meter.step(130.25).tokens_per_second == 4000.0


def test_no_elapsed_time_gives_nan_rather_than_infinity():
    meter = _meter()
    meter.step(101.0)
    assert math.isnan(meter.step(101.0).tokens_per_second)


def test_mfu_is_model_flops_over_the_peak_of_all_devices():
    meter = _meter(flops_per_token=6e9, peak=1e15, devices=4)
    rate = meter.step(102.0)  # 500 tokens/s
    assert rate.mfu == pytest.approx(6e9 * 500 / (1e15 * 4))
    assert _meter(flops_per_token=6e9, peak=None).step(102.0).mfu is None  # CPU: no published peak
    assert _meter(flops_per_token=None, peak=1e15).step(102.0).mfu is None


def test_the_window_leaves_out_the_first_step_unless_it_is_read_at_once():
    meter = _meter()
    meter.step(110.0)  # 10 s: compilation
    meter.step(111.0)
    meter.step(113.0)
    window = meter.window()  # steps 2 and 3 only: 2 steps in 3 s
    assert window.tokens_per_second == pytest.approx(2000 / 3)
    assert window.seconds_per_step == pytest.approx(1.5)

    meter = _meter()
    meter.step(110.0)
    first = meter.window()  # a log line at the first step describes the first step
    assert (first.tokens_per_second, first.seconds_per_step) == (100.0, 10.0)
    meter.step(112.0)
    second = meter.window()
    assert (second.tokens_per_second, second.seconds_per_step) == (500.0, 2.0)


def test_each_window_starts_where_the_previous_one_ended():
    meter = _meter()
    meter.step(101.0)
    meter.step(102.0)
    meter.window()
    meter.step(106.0)
    window = meter.window()
    assert (window.tokens_per_second, window.seconds_per_step) == (250.0, 4.0)
    assert math.isnan(meter.window().tokens_per_second)  # nothing read since
