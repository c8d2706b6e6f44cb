"""Train steps on 8 simulated CPU devices: data=4 x model=2 and fsdp=8 give the single-device
losses and parameters, with parameters and optimizer state really split across devices."""


import jax
import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows

VOCAB, SEQ, STEPS = 64, 16, 2
MODEL = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices")

def run(mesh: MeshConfig, out_dir):
    config = TrainerConfig(num_train_steps=STEPS, batch_size=8, microbatch_size=8, mesh=mesh, checkpoint_at_end=False)
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=5)
    trainer = Trainer(config, AdamConfig(1e-2, 0.1), output_dir=str(out_dir))
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
    assert [r["loss"] for r in sharded.history] == pytest.approx([r["loss"] for r in single.history], rel=2e-5)

    params = sharded.state.params
    assert len(params.layers[0].mlp.gate_proj.weight.sharding.device_set) == 8
    _assert_split(params.layers[0].mlp.gate_proj.weight, split_axis)  # [embed, mlp]
    _assert_split(params.embed.weight, split_axis)  # [vocab, embed]
    # Adam's moments live where their parameters live.
    mu = sharded.state.opt_state[1].mu
    assert mu.embed.weight.sharding == params.embed.weight.sharding
    assert mu.layers[1].attention.o_proj.weight.sharding == params.layers[1].attention.o_proj.weight.sharding

    for a, b in zip(jax.tree.leaves(sharded.state.params), jax.tree.leaves(single.state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
