"""The element-wise optimizers in the trainer, on a tiny Llama: each trains (the loss goes down),
its state is saved in the run's checkpoint and read back bit for bit, and a run SIGKILLed after
a checkpoint resumes to the uninterrupted run's state bit for bit. Adam-mini's reduced second
moment lays out on a sharded mesh; schedule-free evaluates and returns its averaged point."""

from __future__ import annotations

import os

import equinox as eqx
import jax
import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import (
    AdamConfig,
    AdamMiniConfig,
    AdoptConfig,
    LionConfig,
    MarsConfig,
    ScheduleFreeAdamConfig,
    SophiaConfig,
)
from levanter.trainer import Checkpointer, MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows

VOCAB, SEQ, BATCH, N = 64, 16, 8, 4
MODEL = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)

OPTIMIZERS = {
    "adopt": AdoptConfig(1e-2, 0.1, warmup=2),
    "mars": MarsConfig(1e-2, 0.1, warmup=2),
    "cautious_adam": AdamConfig(1e-2, 0.1, warmup=2, cautious=True),
    "cautious_lion": LionConfig(3e-3, 0.3, warmup=2, cautious=True),
    "adam_mini": AdamMiniConfig(1e-2, 0.1, warmup=2),
    "sophia": SophiaConfig(1e-2, 0.1, warmup=2, update_interval=3),
    "schedule_free": ScheduleFreeAdamConfig(1e-2, 0.1, warmup=2),
}


def source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=BATCH, seed=3)


def init_model(key):
    return MODEL.build(VOCAB, key=key)


def trainer_config(**overrides):
    settings = dict(num_train_steps=2 * N, batch_size=BATCH, steps_per_checkpoint=N, keep_last_checkpoints=None,
                    log_every=N, mesh=MeshConfig(data=1))
    return TrainerConfig(**{**settings, **overrides})


@pytest.fixture(scope="module", params=sorted(OPTIMIZERS))
def straight(request, tmp_path_factory):
    name = request.param
    out = str(tmp_path_factory.mktemp(name))
    return name, Trainer(trainer_config(), OPTIMIZERS[name], output_dir=out).train(init_model, source()), out


def test_each_optimizer_trains_the_model(straight):
    name, result, _ = straight
    losses = [row["loss"] for row in result.history if "loss" in row]
    assert len(losses) == 2 * N and all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.1, (name, losses)


def test_the_optimizer_state_round_trips_through_the_checkpoint(straight):
    name, result, out = straight
    fresh = Trainer(trainer_config(), OPTIMIZERS[name], output_dir=str(out) + "-template")
    template, _, _ = fresh.init_state(init_model)
    step, restored = Checkpointer(os.path.join(out, "checkpoints")).restore_latest(template)
    assert step == 2 * N
    saved, read = jax.tree.leaves(result.state.opt_state), jax.tree.leaves(restored.opt_state)
    assert len(saved) == len(read) >= 3
    for a, b in zip(saved, read):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_run_resumed_after_sigkill_ends_bitwise_equal_to_the_uninterrupted_one(straight, tmp_path, train_until_killed):
    name, result, _ = straight
    out = str(tmp_path / name)
    train_until_killed(__file__, name, out, kill_at=N + 2)  # the step-N checkpoint is written; two more steps are lost
    assert Checkpointer(os.path.join(out, "checkpoints")).all_steps() == [N]
    resumed = Trainer(trainer_config(), OPTIMIZERS[name], output_dir=out).train(init_model, source())
    assert resumed.resumed_from == N
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(result.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.isolated  # 8 simulated devices: see conftest.py
@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")
def test_adam_minis_reduced_second_moment_is_replicated_on_a_sharded_mesh_and_checkpointed(tmp_path):
    config = trainer_config(num_train_steps=2, steps_per_checkpoint=None, mesh=MeshConfig(data=4, model=2))
    result = Trainer(config, AdamMiniConfig(1e-2, 0.1), output_dir=str(tmp_path)).train(init_model, source())
    template, _, _ = Trainer(config, AdamMiniConfig(1e-2, 0.1), output_dir=str(tmp_path / "t")).init_state(init_model)
    _, restored = Checkpointer(str(tmp_path / "checkpoints")).restore_latest(template)
    for a, b in zip(jax.tree.leaves(restored.opt_state), jax.tree.leaves(result.state.opt_state), strict=True):
        assert a.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    nu = result.state.opt_state[1].nu
    assert nu.layers[0].attention.q_proj.weight.shape == (1, MODEL.num_heads, 1)  # one value per head
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(nu))  # every block is reduced here
    mu = result.state.opt_state[1].mu.layers[0].attention.q_proj.weight
    assert mu.sharding == result.state.params.layers[0].attention.q_proj.weight.sharding  # the full moment: like its parameter
    assert np.isfinite(result.final_train_loss)


def test_schedule_free_evaluates_and_returns_its_averaged_point(tmp_path):
    config = OPTIMIZERS["schedule_free"]
    windows = source()
    evals = {"held_out": lambda: windows.sequential_batches(limit=2)}
    trainer = Trainer(trainer_config(steps_per_checkpoint=None), config, output_dir=str(tmp_path))
    result = trainer.train(init_model, windows, eval_sources=evals)

    trained_at = result.state.params
    averaged = config.evaluation_params(result.state.params, result.state.opt_state)
    returned = jax.tree.leaves(eqx.filter(result.model, eqx.is_inexact_array))
    for got, want in zip(returned, jax.tree.leaves(averaged), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    at_x = trainer.evaluate(averaged, evals)["held_out"]
    at_y = trainer.evaluate(trained_at, evals)["held_out"]
    assert at_x != at_y
    assert result.eval_losses["held_out"] == pytest.approx(at_x, rel=1e-6)


def test_sophia_trains_with_microbatches(tmp_path):
    # Its Hessian estimate then differentiates the first microbatch's loss, scaled to the batch.
    config = trainer_config(num_train_steps=4, steps_per_checkpoint=None, checkpoint_at_end=False, microbatch_size=BATCH // 2)
    result = Trainer(config, SophiaConfig(1e-2, 0.1, update_interval=2), output_dir=str(tmp_path)).train(init_model, source())
    losses = [row["loss"] for row in result.history if "loss" in row]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]
