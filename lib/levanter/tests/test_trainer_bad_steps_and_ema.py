"""Skipping bad steps and the weight average, in the trainer on a tiny Llama: a step whose loss is
NaN or spikes leaves parameters and optimizer state exactly as they were and is counted; the
average follows its closed form, is evaluated beside the weights and is the model returned; a run
resumed after a crash ends bit for bit where the uninterrupted one does, history and average included."""

from __future__ import annotations

import os
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import Checkpointer, MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.step import NextTokenObjective
from levanter.trainer.step_metrics import NonFiniteLossError

VOCAB, SEQ, BATCH = 64, 16, 4
MODEL = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
# A batch whose first token is one of these (never drawn otherwise) has its loss multiplied by NaN
# or by 100, gradient included.
NAN_MARK, SPIKE_MARK = VOCAB - 1, VOCAB - 2
OPTIMIZER = AdamConfig(1e-2, 0.1, lr_schedule="constant")  # a constant rate: runs of any length agree step by step


@dataclass(frozen=True)
class Sabotaged(NextTokenObjective):
    def loss(self, model, batch, context, normaliser, num_microbatches):
        value, sums = super().loss(model, batch, context, normaliser, num_microbatches)
        first = batch.tokens[0, 0]
        scale = jnp.where(first == NAN_MARK, jnp.nan, jnp.where(first == SPIKE_MARK, 100.0, 1.0))
        return value * scale, jax.tree.map(lambda s: s * scale, sums)


class MarkedWindows(InMemoryWindows):
    """Batch ``k`` as usual, its first token replaced by ``marks[k]`` where given; ``order`` picks
    which underlying batch each step gets."""

    def __init__(self, marks=None, order=None):
        super().__init__(np.tile(np.arange(SPIKE_MARK), 32), seq_len=SEQ, batch_size=BATCH, seed=3)
        self.marks, self.order = dict(marks or {}), order

    def batch_at(self, step):
        batch = super().batch_at(step if self.order is None else self.order[step])
        if step in self.marks:
            batch.tokens[0, 0] = self.marks[step]
        return batch


def init_model(key):
    return MODEL.build(VOCAB, key=key)


def trainer_config(steps, **overrides):
    settings = dict(num_train_steps=steps, batch_size=BATCH, log_every=100, mesh=MeshConfig(data=1))
    return TrainerConfig(**{**settings, **overrides})


def train(config, source, out, **kwargs):
    return Trainer(config, OPTIMIZER, output_dir=str(out), objective=Sabotaged(), **kwargs).train(init_model, source)


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


SKIP = dict(skip_bad_steps=True, skip_loss_spike_factor=3.0, skip_loss_window=2)


def test_nan_and_spiking_steps_leave_the_state_unchanged_and_are_counted(tmp_path):
    # Step 3's loss is NaN; step 5's is 100x a normal one once two finite losses fill the window.
    marks = {2: NAN_MARK, 4: SPIKE_MARK}
    result = train(trainer_config(5, **SKIP), MarkedWindows(marks), tmp_path / "skipping")
    # The same updates without the bad batches: batches 0, 1 and 3 over three steps.
    clean = train(trainer_config(3, **SKIP), MarkedWindows(order=[0, 1, 3]), tmp_path / "clean")
    assert_trees_equal(result.state.params, clean.state.params)
    assert_trees_equal(result.state.opt_state, clean.state.opt_state)  # Adam's count included
    rows = [row for row in result.history if "loss" in row]
    assert [row["train/skipped_steps"] for row in rows] == [0, 0, 1, 0, 1]
    assert [row["train/skipped_steps_total"] for row in rows] == [0, 0, 1, 1, 2]
    assert np.isnan(rows[2]["loss"]) and rows[4]["loss"] > 3 * max(rows[0]["loss"], rows[1]["loss"])
    assert int(result.state.step) == 5 and int(result.state.bad_steps.skipped) == 2


def test_without_skipping_a_nan_loss_stops_the_run(tmp_path):
    with pytest.raises(NonFiniteLossError, match="at step 3"):
        train(trainer_config(5), MarkedWindows({2: NAN_MARK}), tmp_path)


def test_the_weight_average_follows_its_closed_form_is_evaluated_and_returned(tmp_path):
    decay, steps = 0.5, 3
    windows = MarkedWindows()
    evals = {"held_out": lambda: windows.sequential_batches(limit=2)}
    config = trainer_config(steps, ema_decay=decay, steps_per_checkpoint=1, keep_last_checkpoints=None)
    trainer = Trainer(config, OPTIMIZER, output_dir=str(tmp_path))
    result = trainer.train(init_model, windows, eval_sources=evals)

    template, _, _ = trainer.init_state(init_model)
    checkpoints = Checkpointer(os.path.join(str(tmp_path), "checkpoints"))
    weights = [template.params] + [checkpoints.restore(k, template).params for k in range(1, steps + 1)]
    # ema_3 = d^3 p0 + (1 - d) (d^2 p1 + d p2 + p3); the step's e + (1 - d)(p - e) rounds once or
    # twice per step, each at most half an f32 ulp of the largest weight.
    coefficients = [decay**steps] + [(1 - decay) * decay ** (steps - k) for k in range(1, steps + 1)]
    expected = jax.tree.map(lambda *ps: sum(c * np.asarray(p, np.float64) for c, p in zip(coefficients, ps)), *weights)
    largest = max(float(np.max(np.abs(np.asarray(x)))) for w in weights for x in jax.tree.leaves(w))
    for got, want in zip(jax.tree.leaves(result.state.ema), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=4 * steps * largest * 2.0**-24)

    returned = jax.tree.leaves(eqx.filter(result.model, eqx.is_inexact_array))
    assert_trees_equal(returned, result.state.ema)
    last_eval = [row for row in result.history if "eval/held_out/loss" in row][-1]
    assert last_eval["eval_ema/held_out/loss"] == pytest.approx(trainer.evaluate(result.state.ema, evals)["held_out"], rel=1e-6)
    assert last_eval["eval/held_out/loss"] == pytest.approx(trainer.evaluate(result.state.params, evals)["held_out"], rel=1e-6)
    assert last_eval["eval_ema/held_out/loss"] != last_eval["eval/held_out/loss"]
    assert result.ema_eval_losses == {"held_out": last_eval["eval_ema/held_out/loss"]}
    assert result.eval_losses == {"held_out": last_eval["eval/held_out/loss"]}


class Crash(Exception):
    pass


def test_a_resumed_run_ends_bitwise_equal_with_the_average_and_the_skip_history(tmp_path):
    # The spike at step 6 is judged on losses recorded before the crash.
    marks = {1: NAN_MARK, 5: SPIKE_MARK}
    config = trainer_config(6, ema_decay=0.9, steps_per_checkpoint=3, **SKIP)
    straight = train(config, MarkedWindows(marks), tmp_path / "straight")
    assert int(straight.state.bad_steps.skipped) == 2

    def crash_after_the_checkpoint(trainer, step, metrics):
        if step == 4:
            trainer.checkpointer.wait()
            raise Crash

    out = tmp_path / "crashed"
    with pytest.raises(Crash):
        train(config, MarkedWindows(marks), out, hooks=[crash_after_the_checkpoint])
    resumed = train(config, MarkedWindows(marks), out)
    assert resumed.resumed_from == 3
    assert_trees_equal(resumed.state, straight.state)
    assert [row["train/skipped_steps_total"] for row in resumed.history if "loss" in row] == [1, 1, 2]
