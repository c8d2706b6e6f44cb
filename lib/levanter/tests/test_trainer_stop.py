"""Stopping a run between steps: PREEMPT checkpoints then stops; ABANDON stops and writes nothing more."""

import os

import numpy as np
import pytest

from levanter.main.train_lm import TrainLmConfig, train_lm
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.stopping import StopAction, StopSignal, TrainingAbandoned, TrainingPreempted
from levanter.trainer.tracker import read_metrics

VOCAB, SEQ = 64, 16
MODEL = dict(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


def trainer_config():
    return TrainerConfig(num_train_steps=8, batch_size=8, steps_per_checkpoint=4, keep_last_checkpoints=None, mesh=MeshConfig(data=1))


def optimizer():
    return AdamConfig(3e-3, 0.1, warmup=2)


def source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=3)


def init_model(key):
    return LlamaConfig(**MODEL).build(VOCAB, key=key)


def _ask_at(step_to_ask: int, signal: StopSignal, action: StopAction, reason: str):
    def hook(trainer, step, metrics):
        if step == step_to_ask:
            signal.request(action, reason)

    return hook


def test_a_preempt_request_checkpoints_the_next_step_then_stops(tmp_path):
    stop = StopSignal()
    trainer = Trainer(
        trainer_config(), optimizer(), output_dir=str(tmp_path),
        hooks=[_ask_at(3, stop, StopAction.PREEMPT, "the run was interrupted (Ctrl-C)")], stop_sources=[stop],
    )
    # Step 3's metrics are read while step 4 runs: step 4 completes, is saved, and the run stops.
    with pytest.raises(TrainingPreempted, match=r"after step 4.*interrupted \(Ctrl-C\)"):
        trainer.train(init_model, source())
    assert trainer.checkpointer.all_steps() == [4]


def test_an_abandon_request_stops_without_writing_a_checkpoint_or_metrics(tmp_path):
    stop = StopSignal()
    # Periodic checkpoints at 4 and 8 (the end): asked at step 5, neither step 8 nor the end is saved.
    trainer = Trainer(
        trainer_config(), optimizer(), output_dir=str(tmp_path),
        hooks=[_ask_at(5, stop, StopAction.ABANDON, "the lease was lost")], stop_sources=[stop],
    )
    with pytest.raises(TrainingAbandoned, match="the lease was lost"):
        trainer.train(init_model, source())
    trainer.checkpointer.wait()
    assert trainer.checkpointer.all_steps() == [4]
    assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl")) if "loss" in r] == [1, 2, 3, 4, 5]


def test_abandon_outranks_a_preemption_asked_at_the_same_time():
    stop = StopSignal()
    stop.request(StopAction.PREEMPT, "SIGTERM")
    stop.request(StopAction.ABANDON, "lease lost")
    stop.request(StopAction.PREEMPT, "SIGTERM again")
    assert stop().action is StopAction.ABANDON and stop().reason == "lease lost"


def test_train_lm_abandoned_writes_no_eval_record_and_no_export(tmp_path):
    stop = StopSignal()
    stop.request(StopAction.ABANDON, "another process owns this folder now")
    config = TrainLmConfig(
        model=LlamaConfig(**MODEL), optimizer=optimizer(), trainer=trainer_config(), vocab_size=VOCAB,
        output_path=str(tmp_path),
    )
    with pytest.raises(TrainingAbandoned, match="another process owns this folder now"):
        train_lm(config, source(), stop_sources=[stop])
    assert not os.path.exists(tmp_path / "eval.json") and not os.path.exists(tmp_path / "hf")
    assert not os.listdir(tmp_path / "checkpoints")
