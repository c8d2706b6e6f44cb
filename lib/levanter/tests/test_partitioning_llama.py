"""Partitioning over 8 simulated CPU devices (set by the root conftest)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import haliax
from haliax.axes import Axes
from haliax.partitioning import AxisRules, PartitioningError, constrain, make_mesh, partition_spec, shard, use_mesh
from levanter.models import LlamaConfig

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")

VOCAB = 64
CONFIG = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=32, use_scan=True)


@pytest.fixture(scope="module")
def model():
    return CONFIG.build(VOCAB, key=jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.PRNGKey(1), (8, 16), 0, VOCAB, dtype=jnp.int32)


def _logits(model, tokens):
    return model(tokens)


@pytest.fixture(scope="module")
def single_device_logits(model, tokens):
    return jax.jit(_logits)(model, tokens)


def _sharded_logits(model, tokens, mesh):
    params = shard(model, mesh)
    tokens = jax.device_put(tokens, jax.sharding.NamedSharding(mesh, partition_spec(("batch", None), tokens.shape, mesh, AxisRules())))
    with use_mesh(mesh):
        logits = jax.jit(_logits)(params, tokens)
    return params, logits


@pytest.mark.isolated  # 8 simulated devices: see conftest.py
def test_data_and_tensor_parallel_shards_parameters_and_matches(model, tokens, single_device_logits):
    mesh = make_mesh(data=4, model=2)
    params, logits = _sharded_logits(model, tokens, mesh)
    q = params.layers.inner.attention.q_proj.weight  # [layers, embed, heads, head_dim]
    assert q.sharding.spec == P(None, None, "model", None)
    assert q.addressable_shards[0].data.shape == (2, 32, 2, 8)
    up = params.layers.inner.mlp.up_proj.weight  # [layers, embed, mlp]
    assert up.addressable_shards[0].data.shape == (2, 32, 32)
    assert params.lm_head.weight.sharding.spec == P(None, "model")
    assert params.final_norm.weight.sharding.is_fully_replicated
    np.testing.assert_allclose(logits, single_device_logits, atol=1e-5)


@pytest.mark.isolated  # 8 simulated devices: see conftest.py
def test_fsdp_shards_embed_axis_and_matches(model, tokens, single_device_logits):
    mesh = make_mesh(data=1, fsdp=8)
    params, logits = _sharded_logits(model, tokens, mesh)
    embed = params.embed.weight  # [vocab, embed]
    assert embed.sharding.spec == P(None, "fsdp")
    assert embed.addressable_shards[0].data.shape == (VOCAB, 4)
    down = params.layers.inner.mlp.down_proj.weight  # [layers, mlp, embed]
    assert {s.data.shape for s in down.addressable_shards} == {(2, 64, 4)}
    assert len({s.device for s in down.addressable_shards}) == 8
    np.testing.assert_allclose(logits, single_device_logits, atol=1e-5)


def test_partition_spec_replicates_what_cannot_split():
    mesh = make_mesh(data=4, model=2)
    rules = AxisRules.default()
    # One kv head cannot be split two ways; a mesh axis is never used twice in one array.
    assert partition_spec(("embed", "kv_heads", "head_dim"), (32, 1, 8), mesh, rules) == P(None, None, None)
    assert partition_spec(("mlp", "vocab"), (64, 64), mesh, rules) == P("model", None)
    assert partition_spec(("batch", "seq"), (8, 16), mesh, rules) == P("data", None)
    assert partition_spec(("batch",), (8,), make_mesh(data=2, fsdp=4), rules) == P(("data", "fsdp"))
    assert partition_spec(("embed",), (32,), mesh, rules.with_overrides(embed="data")) == P("data")


def test_logical_axes_pairs_with_parameters(model):
    axes = haliax.logical_axes(model)
    assert axes.layers.inner.attention.k_proj.weight == Axes(("layers", "embed", "kv_heads", "head_dim"))
    assert axes.embed.weight == Axes(("vocab", "embed"))
    paired = jax.tree.map(lambda a, x: len(a) == x.ndim, axes, model, is_leaf=lambda n: isinstance(n, Axes))
    assert all(jax.tree.leaves(paired))


def test_mesh_errors_and_constrain_without_mesh():
    with pytest.raises(PartitioningError, match="needs 6 devices"):
        make_mesh(data=3, model=2)
    with pytest.raises(PartitioningError, match="At most one"):
        make_mesh(data=-1, fsdp=-1)
    assert make_mesh(model=2).shape == {"data": 4, "fsdp": 1, "experts": 1, "model": 2}
    assert make_mesh(data=2, experts=4).shape == {"data": 2, "fsdp": 1, "experts": 4, "model": 1}
    x = jnp.ones((2, 3))
    assert constrain(x, ("batch", "embed")) is x
