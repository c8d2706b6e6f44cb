"""Matrix layouts from logical axis names, and the matrix optimizers' configs: the roles and fan
sides of every parameter of our models, exact reshapes, stacked layers treated as separate
matrices, JSON round trips and refused settings."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from haliax.module import logical_axes
from levanter.models.llama import LlamaConfig
from levanter.models.moe import MoeConfig
from levanter.optim import KronConfig, MuonConfig, OptimizerConfig, OptimizerConfigError, SOAPConfig, ScionConfig
from levanter.optim.matrix_layout import layout_of, matrix_layouts
from levanter.optim.newton_schulz import orthogonalize


def _layouts_by_name(model):
    params = jax.eval_shape(lambda: model)
    layouts = matrix_layouts(params, logical_axes(params))
    flat = jax.tree_util.tree_flatten_with_path(layouts, is_leaf=lambda x: hasattr(x, "role"))[0]
    return {jax.tree_util.keystr(path): layout for path, layout in flat}


def test_every_llama_parameter_gets_its_role_and_fan_sides():
    config = LlamaConfig(hidden_dim=8, intermediate_dim=16, num_layers=2, num_heads=2, num_kv_heads=1, max_seq_len=8,
                         qkv_bias=True, use_scan=True)
    layouts = _layouts_by_name(config.build(32, key=jax.random.PRNGKey(0)))

    def sides(name):
        l = layouts[name]
        return l.role, [l.shape[d] for d in l.stack], l.fan_in_size, l.fan_out_size

    assert sides(".embed.weight") == ("embedding", [], 32, 8)
    assert sides(".lm_head.weight") == ("head", [], 8, 32)
    assert sides(".layers.inner.attention.q_proj.weight") == ("matrix", [2], 8, 2 * 4)  # embed -> (heads, head_dim)
    assert sides(".layers.inner.attention.o_proj.weight") == ("matrix", [2], 2 * 4, 8)  # (heads, head_dim) -> embed
    assert sides(".layers.inner.mlp.down_proj.weight") == ("matrix", [2], 16, 8)
    assert sides(".layers.inner.input_norm.weight")[0] == "vector"  # (layers, embed)
    assert sides(".layers.inner.attention.q_bias.weight")[0] == "vector"  # (layers, heads, head_dim): a bias
    assert sides(".final_norm.weight") == ("vector", [], 1, 8)
    assert {l.role for l in layouts.values()} == {"embedding", "head", "matrix", "vector"}


def test_moe_experts_stack_and_the_router_is_a_matrix():
    config = MoeConfig(hidden_dim=8, intermediate_dim=16, num_layers=2, num_heads=2, num_kv_heads=1, max_seq_len=8,
                       num_experts=4, num_experts_per_token=2, use_scan=True)
    layouts = _layouts_by_name(config.build(32, key=jax.random.PRNGKey(0)))
    experts = next(l for name, l in layouts.items() if name.endswith("gate_proj"))
    assert experts.role == "matrix" and experts.matrix_shape == (2 * 4, 8, 16)  # layers x experts copies of embed -> mlp
    router = next(l for name, l in layouts.items() if name.endswith("router.weight"))
    assert router.role == "matrix" and router.matrix_shape == (2, 8, 4)  # its experts axis is its output, not a stack


def test_without_axis_names_2d_arrays_are_matrices_and_the_rest_vectors():
    layouts = matrix_layouts({"w": jnp.zeros((3, 5)), "b": jnp.zeros(5), "t": jnp.zeros((2, 3, 5))})
    assert (layouts["w"].role, layouts["w"].matrix_shape) == ("matrix", (1, 3, 5))
    assert layouts["b"].role == "vector" and layouts["t"].role == "vector"


def test_to_matrix_groups_fan_axes_and_from_matrix_undoes_it_exactly():
    layout = layout_of((2, 3, 4, 5), ("layers", "heads", "head_dim", "embed"))  # a stacked o_proj
    x = jnp.arange(2 * 3 * 4 * 5, dtype=jnp.float32).reshape(2, 3, 4, 5)
    m = layout.to_matrix(x)
    assert m.shape == (2, 12, 5)
    np.testing.assert_array_equal(m[1, 4 * 1 + 2, 3], x[1, 1, 2, 3])
    np.testing.assert_array_equal(layout.from_matrix(m), x)
    lora_b = layout_of((4, 3, 5), ("lora_rank", "heads", "head_dim"))
    assert (lora_b.fan_in_size, lora_b.fan_out_size) == (4, 15)


@pytest.mark.parametrize(
    "config",
    [
        MuonConfig(0.02, 0.1, max_grad_norm=None, lr_schedule="constant", adam_learning_rate=1e-3),
        ScionConfig(1e-3, 0.1, max_grad_norm=None, lr_schedule="constant"),
        SOAPConfig(1e-2, 0.1, max_grad_norm=None, lr_schedule="constant"),
        KronConfig(1e-2, 0.1, max_grad_norm=None, lr_schedule="constant", preconditioner_update_probability=1.0),
    ],
    ids=lambda c: c.type_name,
)
def test_stacked_layers_step_like_separate_matrices(config, monkeypatch):
    """Two layers stacked on a ``layers`` axis take exactly the steps they take as two parameters.
    (Kron's random probes are drawn per parameter; here every copy gets the same fixed probe.)"""
    import levanter.optim.kron as kron

    def fixed_probe(key, count, leaf_index, layout):
        shape = kron._kron_shape(layout)
        one = jnp.sin(jnp.arange(np.prod(shape[1:]), dtype=jnp.float32) + count).reshape(shape[1:])
        return jnp.broadcast_to(one, shape)

    monkeypatch.setattr(kron, "kron_probe", fixed_probe)
    rng = np.random.RandomState(0)
    weights = jnp.asarray(rng.randn(2, 4, 6), jnp.float32)
    grads = [jnp.asarray(rng.randn(2, 4, 6), jnp.float32) for _ in range(3)]

    def run(params, axes, split):
        tx = config.build(10, param_axes=axes)
        state = tx.init(params)
        for g in grads:
            updates, state = tx.update(split(g), state, params)
            params = optax.apply_updates(params, updates)
        return params

    stacked = run({"w": weights}, {"w": ("layers", "embed", "mlp")}, lambda g: {"w": g})["w"]
    separate = run({"a": weights[0], "b": weights[1]}, {"a": ("embed", "mlp"), "b": ("embed", "mlp")},
                   lambda g: {"a": g[0], "b": g[1]})
    np.testing.assert_allclose(stacked[0], separate["a"], atol=1e-6)
    np.testing.assert_allclose(stacked[1], separate["b"], atol=1e-6)
    assert float(jnp.max(jnp.abs(stacked - weights))) > 1e-3


def test_newton_schulz_pushes_singular_values_near_one():
    x = jnp.asarray(np.random.RandomState(0).randn(3, 8, 5), jnp.float32)  # tall matrices, batched
    s = np.linalg.svd(np.asarray(orthogonalize(x)), compute_uv=False)
    assert np.all((s > 0.6) & (s < 1.25)), s  # the quintic's band, not exactly 1


def test_matrix_configs_round_trip_through_json():
    for config in (
        MuonConfig(0.02, 0.1, update_scale="adamw_rms", ns_coefficients=(3.0, -4.0, 2.0)),
        ScionConfig(1e-3, head_radius=1000.0),
        SOAPConfig(3e-3, shampoo_beta=0.9, precondition_frequency=20),
        KronConfig(1e-3, preconditioner_update_probability=0.5, seed=7),
    ):
        assert OptimizerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert set(OptimizerConfig.registered()) >= {"muon", "scion", "soap", "kron"}


@pytest.mark.parametrize(
    ("cls", "kwargs", "named"),
    [
        (MuonConfig, dict(momentum=1.0), "momentum"),
        (MuonConfig, dict(update_scale="keller"), "update_scale"),
        (MuonConfig, dict(ns_steps=0), "ns_steps"),
        (MuonConfig, dict(adam_learning_rate=-1.0), "adam_learning_rate"),
        (ScionConfig, dict(momentum=0.0), "momentum"),
        (ScionConfig, dict(head_radius=float("nan")), "head_radius"),
        (SOAPConfig, dict(precondition_frequency=0), "precondition_frequency"),
        (SOAPConfig, dict(shampoo_beta=1.0), "shampoo_beta"),
        (KronConfig, dict(preconditioner_update_probability=0.0), "preconditioner_update_probability"),
        (KronConfig, dict(max_size_triangular=2.5), "max_size_triangular"),
    ],
)
def test_matrix_optimizer_settings_out_of_range_are_refused(cls, kwargs, named):
    with pytest.raises(OptimizerConfigError, match=named):
        cls(1e-3, **kwargs)
