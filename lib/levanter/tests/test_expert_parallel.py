"""Expert parallelism on 8 simulated CPU devices: MoE training with the experts split 8 ways, or 4
ways x data 2, gives the losses and parameters of training with the experts replicated, each device
holding its share of the expert weights; rows past an expert's capacity are dropped and counted."""

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from haliax.partitioning import AxisRules, make_mesh, shard, use_mesh
from levanter.models import ConfigError, MoeConfig
from levanter.models.expert_parallel import expert_capacity
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.config import TrainerConfigError
from levanter.trainer.sources import InMemoryWindows

# On simulated CPU devices, collectives can stall for good on a loaded machine where pytest's timeout
# cannot reach: a child process, killed hard if it does (conftest.py).
pytestmark = [pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices"), pytest.mark.isolated]

VOCAB, SEQ, BATCH, STEPS = 64, 16, 8, 2
# expert_capacity_factor=None: an expert takes every row a device sends it, so nothing is dropped and
# expert parallelism computes what the replicated experts compute, up to the order of float sums.
MIXTRAL_SHAPED = MoeConfig(hidden_dim=32, intermediate_dim=32, num_layers=2, num_heads=2, num_kv_heads=2, num_experts=8,
                           num_experts_per_token=2, max_seq_len=SEQ, expert_capacity_factor=None)
QWEN3_MOE_SHAPED = dataclasses.replace(MIXTRAL_SHAPED, head_dim_override=8, qk_norm=True, renormalize_top_k=False, use_scan=True)
MODELS = {"mixtral": MIXTRAL_SHAPED, "qwen3_moe": QWEN3_MOE_SHAPED}
OPTIMIZER = AdamConfig(1e-2, 0.1)
EXPERT_WEIGHTS = ("gate_proj", "up_proj", "down_proj")

# Tolerances from float32 arithmetic (eps = 1.2e-7), as in test_sharded_training.py. Splitting the
# experts changes the order of float sums only: an expert's rows are multiplied as one padded batch
# (einsum) instead of ragged groups, and each weight's gradient is summed over the devices' tokens
# in another order. A reordered sum of BATCH * SEQ = 128 per-token terms moves by ~sqrt(128) rounding
# steps of its size, so losses (means over 128 tokens) agree within ~128 * eps = 1.5e-5 relative.
# Routing is a top-k of router probabilities, which such rounding could flip only for a token whose
# two candidate experts' probabilities agree to ~1e-7: a chance of ~1e-5 per token here.
LOSS_RTOL = 2e-5


def params_atol(state) -> float:
    """Adam's first step moves a parameter by lr * g / (|g| + eps_adam), whose slope peaks at
    1 / eps_adam for a gradient near zero: rounding |dg| ~ sqrt(128) * eps * G of a gradient of
    typical size G (read from Adam's second moment) moves such a parameter by lr * |dg| / eps_adam."""
    nu = jax.tree.leaves(state.opt_state[1].nu)
    v_hat = np.concatenate([np.asarray(x).ravel() for x in nu]) / (1 - OPTIMIZER.beta2**STEPS)
    gradient_rounding = math.sqrt(BATCH * SEQ) * np.finfo(np.float32).eps * np.median(np.sqrt(v_hat))
    return float(OPTIMIZER.learning_rate * gradient_rounding / OPTIMIZER.epsilon)


def train(model: MoeConfig, mesh: MeshConfig, out_dir):
    config = TrainerConfig(num_train_steps=STEPS, batch_size=BATCH, mesh=mesh, checkpoint_at_end=False, log_every=1)
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=BATCH, seed=5)
    trainer = Trainer(config, OPTIMIZER, output_dir=str(out_dir))
    return trainer.train(lambda key: model.build(VOCAB, key=key), source)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """Each model trained with its experts replicated (plain data parallelism over the 8 devices)."""
    return {name: train(model, MeshConfig(data=8), tmp_path_factory.mktemp(name)) for name, model in MODELS.items()}


def _device_bytes(tree, device) -> int:
    """Bytes of ``tree``'s arrays that live on ``device``."""
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)


def _expert_weights(params):
    layers = params.layers.inner if hasattr(params.layers, "inner") else params.layers
    layers = layers if isinstance(layers, tuple) else (layers,)
    return [getattr(layer.moe, name) for layer in layers for name in EXPERT_WEIGHTS]


@pytest.mark.parametrize("mesh", [MeshConfig(data=1, experts=8), MeshConfig(data=2, experts=4)], ids=["experts8", "experts4-data2"])
@pytest.mark.parametrize("name", list(MODELS))
def test_split_experts_train_like_replicated_ones(name, mesh, replicated, tmp_path):
    reference = replicated[name]
    split = train(MODELS[name], mesh, tmp_path)
    assert [r["loss"] for r in split.history] == pytest.approx([r["loss"] for r in reference.history], rel=LOSS_RTOL)
    assert all(r["moe/dropped_fraction"] == 0.0 for r in split.history + reference.history)
    # Without a capacity factor an expert takes as many rows from a device as the device has tokens.
    assert split.history[0]["moe/expert_capacity"] == BATCH * SEQ // 8
    assert "moe/expert_capacity" not in reference.history[0]

    atol = params_atol(reference.state)
    assert atol < OPTIMIZER.learning_rate / 4  # else a wrong update could pass for rounding
    for a, b in zip(jax.tree.leaves(split.state.params), jax.tree.leaves(reference.state.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)

    # Each device holds num_experts / experts of every expert weight, and so of its Adam moments.
    for weight in _expert_weights(split.state.params):
        shard_shape = weight.sharding.shard_shape(weight.shape)
        assert shard_shape[-3] == weight.shape[-3] // mesh.experts and shard_shape[-2:] == weight.shape[-2:]
    mu = _expert_weights(split.state.opt_state[1].mu)
    assert [m.sharding for m in mu] == [w.sharding for w in _expert_weights(split.state.params)]


def test_per_device_bytes_of_expert_weights_split_eight_ways(replicated, tmp_path):
    split = train(MIXTRAL_SHAPED, MeshConfig(data=1, experts=8), tmp_path)
    device = jax.devices()[0]
    total = sum(w.nbytes for w in _expert_weights(split.state.params))
    assert _device_bytes(_expert_weights(replicated["mixtral"].state.params), device) == total
    assert _device_bytes(_expert_weights(split.state.params), device) == total // 8
    # So is each router's expert dimension; the rest (attention, norms, embeddings) stays whole.
    routers = [layer.moe.router.weight for layer in split.state.params.layers]
    router_bytes = sum(r.nbytes for r in routers)
    assert _device_bytes(routers, device) == router_bytes // 8
    rest = sum(x.nbytes for x in jax.tree.leaves(split.state.params)) - total - router_bytes
    assert _device_bytes(split.state.params, device) == rest + (total + router_bytes) // 8


# -- one layer under a mesh: capacity, dropping, and batches the experts axis cannot split ----------


def _layer_and_inputs(batch: int, capacity_factor):
    config = dataclasses.replace(MIXTRAL_SHAPED, expert_capacity_factor=capacity_factor)
    layer = config.build(VOCAB, key=jax.random.PRNGKey(0)).layers[0].moe
    # A decisive router, so that routing is far from ties and some experts get many more rows than others.
    layer = eqx.tree_at(lambda m: m.router.weight, layer, 20.0 * layer.router.weight)
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, SEQ, config.hidden_dim))
    return layer, x


def _reference_with_drops(layer, x, devices: int, capacity: int):
    """Every row through its expert on one device, except rows past their expert's capacity among
    the same device's tokens (counted in token order), which add nothing; and the number dropped."""
    tokens = np.asarray(x).reshape(-1, x.shape[-1])
    _, weights, experts = (np.asarray(a) for a in layer.route(jnp.asarray(tokens)))
    per_device = tokens.shape[0] // devices
    y = np.zeros_like(tokens)
    dropped = 0
    for d in range(devices):
        taken = np.zeros(layer.num_experts, int)
        for n in range(d * per_device, (d + 1) * per_device):
            for choice, e in enumerate(experts[n]):
                taken[e] += 1
                if taken[e] > capacity:
                    dropped += 1
                    continue
                h = jax.nn.silu(tokens[n] @ layer.gate_proj[e]) * (tokens[n] @ layer.up_proj[e])
                y[n] += weights[n, choice] * np.asarray(h @ layer.down_proj[e])
    return y.reshape(x.shape), dropped


def _run_under(mesh, layer, x):
    with use_mesh(mesh):
        return jax.jit(lambda m, x: m(x))(shard(layer, mesh, AxisRules.default()), x)


def test_rows_past_an_experts_capacity_are_dropped_and_counted():
    layer, x = _layer_and_inputs(batch=8, capacity_factor=0.5)
    k, rows = layer.num_experts_per_token, 8 * SEQ * layer.num_experts_per_token
    capacity = expert_capacity(SEQ, k, layer.num_experts, 0.5)  # 16 tokens per device
    assert capacity == 2
    y, stats = _run_under(make_mesh(data=1, experts=8), layer, x)
    expected, dropped = _reference_with_drops(layer, x, devices=8, capacity=capacity)
    assert 0 < dropped < rows  # the decisive router overfills some experts
    assert float(stats.dropped_fraction) == pytest.approx(dropped / rows)
    np.testing.assert_allclose(np.asarray(y), expected, atol=1e-5)


@pytest.mark.parametrize("mesh", [dict(data=1, experts=4, model=2), dict(data=4, model=2)], ids=["experts4-model2", "data4-model2"])
def test_tensor_parallel_experts_give_the_one_device_output(mesh):
    # The model axis splits each expert's mlp dimension; a psum over it completes the output.
    layer, x = _layer_and_inputs(batch=8, capacity_factor=None)
    mesh = make_mesh(**mesh)
    placed = shard(layer, mesh, AxisRules.default())
    assert "model" in jax.tree.leaves(tuple(placed.gate_proj.sharding.spec))
    y, stats = _run_under(mesh, layer, x)
    expected, _ = _reference_with_drops(layer, x, devices=1, capacity=8 * SEQ)
    assert float(stats.dropped_fraction) == 0.0
    np.testing.assert_allclose(np.asarray(y), expected, atol=1e-5)


def test_a_batch_the_experts_axis_cannot_split_runs_every_expert_on_every_token():
    # 3 rows over experts=8: the tokens stay whole on every device, each device runs its own expert.
    layer, x = _layer_and_inputs(batch=3, capacity_factor=None)
    y, stats = _run_under(make_mesh(data=1, experts=8), layer, x)
    expected, dropped = _reference_with_drops(layer, x, devices=1, capacity=3 * SEQ)
    assert dropped == 0 and float(stats.dropped_fraction) == 0.0
    np.testing.assert_allclose(np.asarray(y), expected, atol=1e-5)


def test_replicated_experts_under_data_parallelism_run_each_devices_own_tokens():
    # Traced as one computation over the whole batch, the sort by expert gathered every token onto
    # every device; each device now groups and multiplies its own tokens' rows only.
    layer, x = _layer_and_inputs(batch=8, capacity_factor=None)

    def output_and_grads(m, x):
        return jax.value_and_grad(lambda m: jnp.sum(m(x)[0] ** 2))(m)

    one_device = jax.jit(output_and_grads).lower(layer, x).compile()
    mesh = make_mesh(data=8)
    with use_mesh(mesh):
        placed = shard(layer, mesh, AxisRules.default())
        rows = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
        compiled = jax.jit(output_and_grads).lower(placed, rows).compile()
    (value, grads), (expected_value, expected_grads) = compiled(placed, rows), one_device(layer, x)
    assert float(value) == pytest.approx(float(expected_value), rel=1e-5)
    np.testing.assert_allclose(np.asarray(grads.gate_proj), np.asarray(expected_grads.gate_proj), rtol=1e-4, atol=1e-6)
    # Gathered, each device's scratch memory was the one-device program's (the whole batch's rows,
    # forward and backward); with an eighth of the rows it is several times less.
    assert compiled.memory_analysis().temp_size_in_bytes < one_device.memory_analysis().temp_size_in_bytes / 3


def test_experts_that_the_mesh_axis_does_not_divide_are_refused():
    config = dataclasses.replace(MIXTRAL_SHAPED, num_experts=6)
    layer = config.build(VOCAB, key=jax.random.PRNGKey(0)).layers[0].moe
    with pytest.raises(ConfigError, match=r"num_experts \(6\) must be a multiple of the mesh's experts axis \(4\)"):
        _run_under(make_mesh(data=2, experts=4), layer, jnp.zeros((8, SEQ, config.hidden_dim)))


def test_batch_rows_must_split_over_the_experts_axis_too(tmp_path):
    config = TrainerConfig(num_train_steps=1, batch_size=4, mesh=MeshConfig(data=1, experts=8))
    with pytest.raises(TrainerConfigError, match="4 rows must split evenly over data x fsdp x experts = 8 devices"):
        Trainer(config, OPTIMIZER, output_dir=str(tmp_path))
