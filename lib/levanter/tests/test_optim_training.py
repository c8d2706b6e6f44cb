"""The element-wise optimizers in the trainer, on a tiny Llama: each trains (the loss goes down),
its state is saved in the run's checkpoint and read back bit for bit, and a run SIGKILLed after
a checkpoint resumes to the uninterrupted run's state bit for bit. Adam-mini's reduced second
moment lays out on a sharded mesh; schedule-free evaluates and returns its averaged point."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest

from levanter.optim import (
    AdamConfig,
    AdamMiniConfig,
    AdoptConfig,
    LionConfig,
    MarsConfig,
    ScheduleFreeAdamConfig,
    SophiaConfig,
)
from levanter.trainer import Checkpointer, MeshConfig, Trainer

OPTIMIZERS = {
    "adopt": AdoptConfig(1e-2, 0.1, warmup=2),
    "mars": MarsConfig(1e-2, 0.1, warmup=2),
    "cautious_adam": AdamConfig(1e-2, 0.1, warmup=2, cautious=True),
    "cautious_lion": LionConfig(3e-3, 0.3, warmup=2, cautious=True),
    "adam_mini": AdamMiniConfig(1e-2, 0.1, warmup=2),
    "sophia": SophiaConfig(1e-2, 0.1, warmup=2, update_interval=3),
    "schedule_free": ScheduleFreeAdamConfig(1e-2, 0.1, warmup=2),
}


@pytest.fixture(scope="module", params=sorted(OPTIMIZERS))
def straight(request, tmp_path_factory, tiny_llama_training):
    out = str(tmp_path_factory.mktemp(request.param))
    return request.param, tiny_llama_training.train(OPTIMIZERS[request.param], out), out


def test_each_optimizer_trains_the_model(straight, tiny_llama_training):
    name, result, _ = straight
    tiny_llama_training.assert_trains(result, name)


def test_the_optimizer_state_round_trips_through_the_checkpoint(straight, tiny_llama_training):
    name, result, out = straight
    tiny_llama_training.assert_state_round_trips(OPTIMIZERS[name], result, out)


@pytest.mark.slow
def test_a_run_resumed_after_sigkill_ends_bitwise_equal_to_the_uninterrupted_one(straight, tmp_path, tiny_llama_training):
    name, result, _ = straight
    tiny_llama_training.assert_resumes_bitwise_after_sigkill(OPTIMIZERS[name], result, str(tmp_path / name))


@pytest.mark.isolated  # 8 simulated devices: see conftest.py
@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")
def test_adam_minis_reduced_second_moment_is_replicated_on_a_sharded_mesh_and_checkpointed(tmp_path, tiny_llama_training):
    run = tiny_llama_training
    config = run.trainer_config(num_train_steps=2, steps_per_checkpoint=None, mesh=MeshConfig(data=4, model=2))
    result = Trainer(config, AdamMiniConfig(1e-2, 0.1), output_dir=str(tmp_path)).train(run.init_model, run.source())
    template, _, _ = Trainer(config, AdamMiniConfig(1e-2, 0.1), output_dir=str(tmp_path / "t")).init_state(run.init_model)
    _, restored = Checkpointer(str(tmp_path / "checkpoints")).restore_latest(template)
    for a, b in zip(jax.tree.leaves(restored.opt_state), jax.tree.leaves(result.state.opt_state), strict=True):
        assert a.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    nu = result.state.opt_state[1].nu
    assert nu.layers[0].attention.q_proj.weight.shape == (1, run.model.num_heads, 1)  # one value per head
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(nu))  # every block is reduced here
    mu = result.state.opt_state[1].mu.layers[0].attention.q_proj.weight
    assert mu.sharding == result.state.params.layers[0].attention.q_proj.weight.sharding  # the full moment: like its parameter
    assert np.isfinite(result.final_train_loss)


def test_schedule_free_evaluates_and_returns_its_averaged_point(tmp_path, tiny_llama_training):
    config = OPTIMIZERS["schedule_free"]
    windows = tiny_llama_training.source()
    evals = {"held_out": lambda: windows.sequential_batches(limit=2)}
    trainer = Trainer(tiny_llama_training.trainer_config(steps_per_checkpoint=None), config, output_dir=str(tmp_path))
    result = trainer.train(tiny_llama_training.init_model, windows, eval_sources=evals)

    trained_at = result.state.params
    averaged = config.evaluation_params(result.state.params, result.state.opt_state)
    returned = jax.tree.leaves(eqx.filter(result.model, eqx.is_inexact_array))
    for got, want in zip(returned, jax.tree.leaves(averaged), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    at_x = trainer.evaluate(averaged, evals)["held_out"]
    at_y = trainer.evaluate(trained_at, evals)["held_out"]
    assert at_x != at_y
    assert result.eval_losses["held_out"] == pytest.approx(at_x, rel=1e-6)


def test_sophia_trains_with_microbatches(tmp_path, tiny_llama_training):
    # Its Hessian estimate then differentiates the first microbatch's loss, scaled to the batch.
    result = tiny_llama_training.train(SophiaConfig(1e-2, 0.1, update_interval=2), str(tmp_path), num_train_steps=4,
                                       steps_per_checkpoint=None, checkpoint_at_end=False,
                                       microbatch_size=tiny_llama_training.batch_size // 2)
    losses = [row["loss"] for row in result.history if "loss" in row]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]
