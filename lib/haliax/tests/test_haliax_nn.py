"""haliax layers and axis bookkeeping, on tiny arrays."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax import Axes, NamedModule, Stacked, logical_axes
from haliax.nn import Embedding, Linear, RMSNorm, apply_rotary, attention_mask, dot_product_attention, rotary_cos_sin


def test_linear_contracts_trailing_input_dims():
    layer = Linear((2, 3), (4,), in_axes=("heads", "head_dim"), out_axes=("embed",), key=jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 2, 3))
    np.testing.assert_allclose(layer(x), x.reshape(5, 6) @ layer.weight.reshape(6, 4), atol=1e-6)
    assert layer.param_axes() == {"weight": ("heads", "head_dim", "embed")}
    with pytest.raises(ValueError, match="do not match"):
        Linear((2,), (4,), in_axes=("a", "b"), out_axes=("c",), key=jax.random.PRNGKey(0))


def test_linear_over_batch_and_sequence_gives_the_contraction_and_its_gradients():
    # [batch, seq, heads, head_dim] -> [batch, seq, embed]: on a CPU the rows are flattened first.
    layer = Linear((2, 3), (4,), in_axes=("heads", "head_dim"), out_axes=("embed",), key=jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 2, 3))

    def reference(weight, x):
        return jnp.einsum("bshd,hde->bse", x, weight, precision="highest")

    y = layer(x)
    assert y.shape == (3, 5, 4)
    # Six float32 products summed per output: a few float32 epsilons of the operands' scale.
    np.testing.assert_allclose(y, reference(layer.weight, x), atol=1e-5)
    weight_grad, x_grad = jax.grad(lambda w, x: jnp.sum(jnp.sin(eqx.tree_at(lambda l: l.weight, layer, w)(x))),
                                   argnums=(0, 1))(layer.weight, x)
    want_weight, want_x = jax.grad(lambda w, x: jnp.sum(jnp.sin(reference(w, x))), argnums=(0, 1))(layer.weight, x)
    # The weight's gradient sums 15 rows of such products.
    np.testing.assert_allclose(weight_grad, want_weight, atol=1e-5)
    np.testing.assert_allclose(x_grad, want_x, atol=1e-5)


def test_rms_norm_keeps_dtype_and_normalises():
    norm = RMSNorm(8, eps=0.0)
    x = jnp.arange(16, dtype=jnp.float32).reshape(2, 8) + 1
    y = norm(x)
    np.testing.assert_allclose(jnp.sqrt(jnp.mean(y**2, axis=-1)), 1.0, rtol=1e-5)
    assert norm(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16


def test_rotary_preserves_norms_and_depends_only_on_offsets():
    cos, sin = rotary_cos_sin(jnp.arange(6), 4, theta=100.0)
    q = jax.random.normal(jax.random.PRNGKey(0), (6, 1, 4))
    k = jax.random.normal(jax.random.PRNGKey(1), (6, 1, 4))
    rq, rk = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    np.testing.assert_allclose(jnp.linalg.norm(rq, axis=-1), jnp.linalg.norm(q, axis=-1), rtol=1e-5)
    # The same pair of vectors placed at positions (1, 3) and (2, 4) gives the same score.
    q_same, k_same = q.at[2].set(q[1]), k.at[4].set(k[3])
    rq2, rk2 = apply_rotary(q_same, cos, sin), apply_rotary(k_same, cos, sin)
    np.testing.assert_allclose(jnp.dot(rq[1, 0], rk[3, 0]), jnp.dot(rq2[2, 0], rk2[4, 0]), rtol=1e-5)
    with pytest.raises(ValueError, match="even"):
        rotary_cos_sin(jnp.arange(3), 3, theta=10.0)


def test_attention_mask_is_causal_and_per_segment():
    mask = attention_mask(4, jnp.array([[0, 0, 1, 1]]))[0, 0, 0]
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], bool)
    np.testing.assert_array_equal(mask, expected)


def test_grouped_query_attention_equals_repeated_kv():
    q = jax.random.normal(jax.random.PRNGKey(0), (1, 5, 4, 8))
    k = jax.random.normal(jax.random.PRNGKey(1), (1, 5, 2, 8))
    v = jax.random.normal(jax.random.PRNGKey(2), (1, 5, 2, 8))
    attention = jax.jit(dot_product_attention)
    grouped = attention(q, k, v)
    repeated = attention(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2))
    np.testing.assert_allclose(grouped, repeated, atol=1e-5)
    # The first query attends only to the first key, so it returns the first value.
    np.testing.assert_allclose(grouped[0, 0, :2], v[0, 0, :1].repeat(2, 0), atol=1e-6)


class _Pair(NamedModule):
    declared: jax.Array
    undeclared: jax.Array

    def param_axes(self):
        return {"declared": ("vocab", "embed")}


def test_logical_axes_handles_stacks_and_undeclared_arrays():
    pair = _Pair(jnp.zeros((3, 2)), jnp.zeros((5,)))
    stacked = Stacked(eqx.filter_vmap(lambda _: pair)(jnp.arange(4)), 4)
    axes = logical_axes({"one": pair, "many": stacked, "embedding": Embedding(3, 2, key=jax.random.PRNGKey(0))})
    assert axes["one"].declared == Axes(("vocab", "embed"))
    assert axes["one"].undeclared == Axes((None,))
    assert axes["many"].inner.declared == Axes(("layers", "vocab", "embed"))
    assert axes["many"].inner.undeclared == Axes(("layers", None))
    assert axes["embedding"].weight == Axes(("vocab", "embed"))
    with pytest.raises(ValueError, match="declares 2 axis names"):
        logical_axes(_Pair(jnp.zeros((3,)), jnp.zeros(())))
