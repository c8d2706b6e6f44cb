"""Train steps on 8 simulated CPU devices: data=4 x model=2 and fsdp=8 give the single-device
losses and parameters, with parameters and optimizer state really split across devices."""

import math

import jax
import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows

VOCAB, SEQ, BATCH, STEPS = 64, 16, 8, 2
MODEL = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
OPTIMIZER = AdamConfig(1e-2, 0.1)

# On simulated CPU devices, collectives can stall for good on a loaded machine where pytest's timeout
# cannot reach: a child process, killed hard if it does (conftest.py).
pytestmark = [pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices"), pytest.mark.isolated]

# Tolerances from float32 arithmetic (eps = 1.2e-7), not from one machine. Sharding changes only the
# order of the reductions, chiefly a weight's gradient: a sum of BATCH * SEQ = 128 per-token terms,
# on one device or as partial sums over 8. Reordered, such a sum moves by about sqrt(128) rounding
# steps of the gradient's size G (the median |gradient|, read from Adam's second moment below):
#     |dg| ~ sqrt(128) * 1.2e-7 * G        (the worst case, 128 steps, is 11x more)
# - Losses: means over 128 tokens of values computed the same way, so within ~128 * eps = 1.5e-5
#   relative; the parameter differences below move the second step's loss far less (~1e-7).
# - Parameters: Adam's first step moves a parameter by lr * g / (|g| + eps_adam), whose slope in g
#   peaks at 1 / eps_adam for a gradient near zero. With eps_adam = 1e-8, an entry whose gradient
#   is within a few eps_adam of zero (one in some ten thousand here) differs by up to
#   lr * |dg| / eps_adam, about 8e-4; every other entry agrees to a few ulps. Later steps divide by
#   a second moment that remembers the first gradient, so they amplify |dg| by 1 / G at most.
LOSS_RTOL = 2e-5


def params_atol(state) -> float:
    """lr * |dg| / eps_adam, with G from the run's own (bias-corrected) second moment."""
    nu = jax.tree.leaves(state.opt_state[1].nu)
    v_hat = np.concatenate([np.asarray(x).ravel() for x in nu]) / (1 - OPTIMIZER.beta2**STEPS)
    gradient_rounding = math.sqrt(BATCH * SEQ) * np.finfo(np.float32).eps * np.median(np.sqrt(v_hat))
    return float(OPTIMIZER.learning_rate * gradient_rounding / OPTIMIZER.epsilon)


def run(mesh: MeshConfig, out_dir):
    config = TrainerConfig(num_train_steps=STEPS, batch_size=BATCH, microbatch_size=BATCH, mesh=mesh,
                           checkpoint_at_end=False)
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=BATCH, seed=5)
    trainer = Trainer(config, OPTIMIZER, output_dir=str(out_dir))
    return trainer.train(lambda key: MODEL.build(VOCAB, key=key), source)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return run(MeshConfig(data=1), tmp_path_factory.mktemp("single"))


def _assert_split(array, mesh_axis):
    sharding = array.sharding
    assert mesh_axis in jax.tree.leaves(tuple(sharding.spec)), sharding.spec
    shard_shape = sharding.shard_shape(array.shape)
    assert np.prod(shard_shape) < np.prod(array.shape)


@pytest.mark.parametrize(
    "mesh, split_axis",
    [(MeshConfig(data=4, model=2), "model"), (MeshConfig(data=1, fsdp=8), "fsdp")],
    ids=["data4-model2", "fsdp8"],
)
def test_sharded_step_matches_single_device(mesh, split_axis, single, tmp_path):
    sharded = run(mesh, tmp_path)
    assert [r["loss"] for r in sharded.history] == pytest.approx([r["loss"] for r in single.history], rel=LOSS_RTOL)

    params = sharded.state.params
    assert len(params.layers[0].mlp.gate_proj.weight.sharding.device_set) == 8
    _assert_split(params.layers[0].mlp.gate_proj.weight, split_axis)  # [embed, mlp]
    _assert_split(params.embed.weight, split_axis)  # [vocab, embed]
    # Adam's moments live where their parameters live.
    mu = sharded.state.opt_state[1].mu
    assert mu.embed.weight.sharding == params.embed.weight.sharding
    assert mu.layers[1].attention.o_proj.weight.sharding == params.layers[1].attention.o_proj.weight.sharding

    atol = params_atol(single.state)
    assert atol < OPTIMIZER.learning_rate / 4  # else a wrong update could pass for rounding
    for a, b in zip(jax.tree.leaves(sharded.state.params), jax.tree.leaves(single.state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)
