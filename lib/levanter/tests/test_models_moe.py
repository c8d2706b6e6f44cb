"""The Mixtral-shaped MoE model: routing matches a dense reference, the balance loss, sizes."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.models import MoeConfig, next_token_loss
from levanter.models.moe import MoeMlp

VOCAB = 53
TINY = MoeConfig(hidden_dim=16, intermediate_dim=24, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=4, num_experts_per_token=2, max_seq_len=32)


@pytest.fixture(scope="module")
def model():
    return TINY.build(VOCAB, key=jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.PRNGKey(1), (2, 10), 0, VOCAB, dtype=jnp.int32)


def _dense_reference(mlp: MoeMlp, x):
    """Every expert on every token, weighted by the renormalised top-k router weights."""
    probs = jax.nn.softmax(x @ mlp.router.weight, axis=-1)
    top_w, top_e = jax.lax.top_k(probs, mlp.num_experts_per_token)
    top_w = top_w / top_w.sum(-1, keepdims=True)
    y = jnp.zeros_like(x)
    for e in range(mlp.num_experts):
        out = (jax.nn.silu(x @ mlp.gate_proj[e]) * (x @ mlp.up_proj[e])) @ mlp.down_proj[e]
        weight = jnp.sum(jnp.where(top_e == e, top_w, 0.0), axis=-1, keepdims=True)
        y = y + weight * out
    return y


def test_routed_experts_match_dense_reference(model):
    mlp = model.layers[0].moe
    x = jax.random.normal(jax.random.PRNGKey(2), (3, 7, 16))
    y, stats = jax.jit(lambda m, x: m(x))(mlp, x)
    np.testing.assert_allclose(y, jax.jit(_dense_reference)(mlp, x), atol=1e-6)
    assert 1.0 <= float(stats.balance) <= mlp.num_experts
    assert float(stats.dropped_fraction) == 0.0  # nothing is dropped when experts run locally


def test_uniform_router_gives_balance_loss_of_one(model):
    mlp = eqx.tree_at(lambda m: m.router.weight, model.layers[0].moe, jnp.zeros((16, 4)))
    _, stats = mlp(jax.random.normal(jax.random.PRNGKey(2), (4, 16)))
    assert float(stats.balance) == pytest.approx(1.0, abs=1e-6)


def test_forward_aux_loss_and_gradients_reach_router(model, tokens):
    out = jax.jit(lambda m, t: m.forward(t))(model, tokens)
    assert out.logits.shape == (2, 10, VOCAB)
    assert out.aux_loss.shape == () and float(out.aux_loss) >= TINY.router_aux_loss_coef * (1 - 1e-6)

    def objective(m):
        out = m.forward(tokens)
        sums = next_token_loss(out.logits, tokens, jnp.ones(tokens.shape))
        return sums.loss_sum / sums.weight_sum + out.aux_loss

    grads = jax.jit(jax.grad(objective))(model)
    assert float(jnp.abs(grads.layers[0].moe.router.weight).sum()) > 0
    assert float(jnp.abs(grads.layers[1].moe.down_proj).sum()) > 0


def test_parameter_counts(model):
    assert sum(x.size for x in jax.tree.leaves(model)) == TINY.num_parameters(VOCAB)
    inactive_per_layer = 2 * 3 * 16 * 24
    assert TINY.num_active_parameters(VOCAB) == TINY.num_parameters(VOCAB) - 2 * inactive_per_layer
    assert TINY.flops_per_token(VOCAB, 8) < dataclasses.replace(TINY, num_experts_per_token=4).flops_per_token(VOCAB, 8)
