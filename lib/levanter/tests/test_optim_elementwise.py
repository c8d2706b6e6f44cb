"""The element-wise optimizers' configs: JSON round trips (and unchanged records for AdamW and
Lion), refusals of unusable settings, Adam-mini's blocks on a real model, Sophia's need for the loss."""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax.module import logical_axes
from levanter.models.llama import LlamaConfig
from levanter.optim import (
    AdamConfig,
    AdamMiniConfig,
    AdoptConfig,
    LionConfig,
    MarsConfig,
    OptimizerConfig,
    OptimizerConfigError,
    ScheduleError,
    ScheduleFreeAdamConfig,
    SophiaConfig,
)
from levanter.optim.adam_mini import averaged_dims

NEW_CONFIGS = [
    AdoptConfig(1e-3, 0.1, beta2=0.999, clipping=False),
    MarsConfig(3e-3, 0.1, gamma=0.05, vector_beta2=0.9),
    AdamConfig(6e-4, 0.1, cautious=True),
    LionConfig(1e-4, 1.0, cautious=True),
    AdamMiniConfig(1e-3, 0.1, beta2=0.99),
    SophiaConfig(1e-3, 0.1, gamma=0.02, update_interval=5, seed=3),
    ScheduleFreeAdamConfig(1e-3, 0.1, warmup=0.1, weight_lr_power=1.0),
]


@pytest.mark.parametrize("config", NEW_CONFIGS, ids=lambda c: c.type_name)
def test_configs_round_trip_through_json(config):
    record = json.loads(json.dumps(config.to_dict()))
    assert OptimizerConfig.from_dict(record) == config


def test_adam_and_lion_records_are_unchanged_unless_cautious():
    # Step identities hash these records: a run declared before `cautious` existed keeps its hash.
    assert "cautious" not in AdamConfig(6e-4, 0.1).to_dict()
    assert "cautious" not in LionConfig(1e-4, 1.0).to_dict()
    assert AdamConfig(6e-4, 0.1, cautious=True).to_dict()["cautious"] is True
    assert OptimizerConfig.from_dict(AdamConfig(6e-4, 0.1).to_dict()) == AdamConfig(6e-4, 0.1)


@pytest.mark.parametrize(
    ("cls", "kwargs", "named"),
    [
        (AdoptConfig, dict(beta2=1.0), "beta2"),
        (AdoptConfig, dict(epsilon=0.0), "epsilon"),
        (MarsConfig, dict(gamma=-0.1), "gamma"),
        (MarsConfig, dict(vector_beta1=1.0), "vector_beta1"),
        (AdamMiniConfig, dict(beta1=float("nan")), "beta1"),
        (SophiaConfig, dict(gamma=0.0), "gamma"),
        (SophiaConfig, dict(update_interval=0), "update_interval"),
        (SophiaConfig, dict(update_interval=2.5), "update_interval"),
        (ScheduleFreeAdamConfig, dict(beta1=0.0), "beta1"),
        (ScheduleFreeAdamConfig, dict(lr_schedule="cosine"), "lr_schedule"),
        (ScheduleFreeAdamConfig, dict(weight_lr_power=-1.0), "weight_lr_power"),
    ],
)
def test_unusable_settings_are_refused_when_the_config_is_made(cls, kwargs, named):
    with pytest.raises(OptimizerConfigError, match=named):
        cls(learning_rate=1e-3, **kwargs)


def test_schedule_free_takes_no_decaying_schedule():
    with pytest.raises(ScheduleError, match="constant"):
        ScheduleFreeAdamConfig(1e-3, lr_schedule="wsd")


def test_sophia_without_the_loss_names_what_it_needs():
    params = {"w": jnp.ones((2, 3))}
    tx = SophiaConfig(1e-3).build(10)
    with pytest.raises(OptimizerConfigError, match="obj_fn"):
        tx.update(params, tx.init(params), params)


@pytest.mark.parametrize("use_scan", [False, True])
def test_adam_mini_blocks_on_a_llama(use_scan):
    """Per head for q and k, per output neuron for v, o and the MLP, per token for the embedding
    and the head, one block per norm; stacked layers are blocked separately."""
    config = LlamaConfig(hidden_dim=8, intermediate_dim=16, num_layers=2, num_heads=4, num_kv_heads=2,
                         max_seq_len=8, use_scan=use_scan)
    params = eqx.filter(config.build(32, key=jax.random.PRNGKey(0)), eqx.is_inexact_array)
    axes = logical_axes(params)
    state = AdamMiniConfig(1e-3).build(10, param_axes=axes).init(params)
    nu = state[1].nu
    layer = nu.layers if use_scan else nu.layers[0]
    stack = (2,) if use_scan else ()
    layer = getattr(layer, "inner", layer)
    assert nu.embed.weight.shape == (32, 1)
    assert nu.lm_head.weight.shape == (1, 32)
    assert layer.attention.q_proj.weight.shape == (*stack, 1, 4, 1)
    assert layer.attention.k_proj.weight.shape == (*stack, 1, 2, 1)
    assert layer.attention.v_proj.weight.shape == (*stack, 1, 2, 2)
    assert layer.attention.o_proj.weight.shape == (*stack, 1, 1, 8)
    assert layer.mlp.gate_proj.weight.shape == (*stack, 1, 16)
    assert layer.mlp.down_proj.weight.shape == (*stack, 1, 8)
    assert layer.input_norm.weight.shape == (*stack, 1)
    assert nu.final_norm.weight.shape == (1,)
    adam = sum(x.size for x in jax.tree.leaves(params))
    assert sum(x.size for x in jax.tree.leaves(nu)) < adam / 2


def test_adam_mini_keeps_biases_per_entry():
    from jax.tree_util import GetAttrKey

    path = (GetAttrKey("attention"), GetAttrKey("q_bias"), GetAttrKey("weight"))
    assert averaged_dims(path, (4, 2), ("heads", "head_dim")) == ()
    assert averaged_dims((GetAttrKey("norm"),), (2, 8), ("layers", "embed")) == (1,)


def test_sophias_hessian_estimate_equals_optaxs_and_goes_through_a_custom_vjp_loss():
    import optax.contrib

    from levanter.optim.sophia import hutchinson_diagonal

    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.array([0.5, -0.25])}

    def loss(p):
        return jnp.sum(jnp.sin(p["w"]) ** 2) + jnp.sum(p["b"] ** 4) + jnp.sum(p["w"][0] * p["b"][0])

    key = jax.random.PRNGKey(7)
    ours = hutchinson_diagonal(key)
    theirs = optax.contrib.hutchinson_estimator_diag_hessian(key)
    estimate, _ = ours.update(params, ours.init(params), params, obj_fn=loss)
    expected, _ = theirs.update(params, theirs.init(params), params, obj_fn=loss)
    # Two orders of differentiation of a few float32 terms each: a few ulps of values below 4.
    for a, b in zip(jax.tree.leaves(estimate), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    # The trainer's loss: the fused, blockwise cross-entropy, which has a custom VJP. optax's
    # forward-over-reverse product cannot go through it; ours gives what optax gives on the same loss
    # written plainly (logits materialised, no custom VJP), with the same sign vectors.
    from levanter.models.loss import fused_next_token_loss

    hidden_and_head = {"h": jax.random.normal(key, (2, 8, 4)), "w": jax.random.normal(jax.random.PRNGKey(1), (4, 16))}
    tokens = (jnp.arange(16).reshape(2, 8) * 5) % 16
    mask = jnp.ones((2, 8)).at[:, -1].set(0.0)

    def fused(p):
        return jax.tree.leaves(fused_next_token_loss(p["h"], p["w"], tokens, mask, block_size=4))[0].sum()

    def plain(p):
        logits = jnp.einsum("bte,ev->btv", p["h"][:, :-1], p["w"])
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)[..., 0]
        return -jnp.sum(picked * mask[:, :-1])

    np.testing.assert_allclose(fused(hidden_and_head), plain(hidden_and_head), rtol=1e-5)
    with pytest.raises(TypeError, match="custom_vjp"):
        theirs.update(hidden_and_head, theirs.init(hidden_and_head), hidden_and_head, obj_fn=fused)
    estimate, _ = ours.update(hidden_and_head, ours.init(hidden_and_head), hidden_and_head, obj_fn=fused)
    expected, _ = theirs.update(hidden_and_head, theirs.init(hidden_and_head), hidden_and_head, obj_fn=plain)
    for a, b in zip(jax.tree.leaves(estimate), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # second derivatives of a 16-way softmax, float32
