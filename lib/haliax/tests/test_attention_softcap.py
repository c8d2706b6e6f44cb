"""Soft-capped attention scores (Gemma 2): ``cap * tanh(scores / cap)`` before the mask and the
softmax. Every implementation that can soft-cap equals one plain reference in values and
gradients; those that cannot (cuDNN, the Pallas GPU kernel) are refused by name, and "auto" passes
them over."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax.nn import AttentionImplementationError, attend, attention_mask, dot_product_attention
from haliax.nn.attention import resolve_implementation
from haliax.nn.attention_kernels import Platform, splash_attention

B, T, H, KV, D = 2, 40, 4, 2, 16
CAP = 2.0  # small next to the scores (|q.k| / sqrt(D) reaches ~4 here), so capping changes the result
SPLASH_T, SPLASH_BLOCK = 256, 128
HOPPER = Platform("gpu", (9, 0))


def inputs(seq_len):
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(0), 4)
    return (jax.random.normal(kq, (B, seq_len, H, D)), jax.random.normal(kk, (B, seq_len, KV, D)),
            jax.random.normal(kv, (B, seq_len, KV, D)), jax.random.normal(kc, (B, seq_len, H, D)))


def segments(seq_len):
    return jnp.asarray(np.stack([np.repeat([0, 1, 2], [7, 20, seq_len - 27]), np.zeros(seq_len, int)]), jnp.int32)


def reference(q, k, v, segment_ids, cap):
    """The capped scores written out in float32 at full precision, k/v repeated per query head."""
    group = H // KV
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") / np.sqrt(D)
    scores = cap * jnp.tanh(scores / cap)
    positions = jnp.arange(q.shape[1])
    mask = (positions[:, None] >= positions[None, :]) & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", weights, v, precision="highest")


def values_and_grads(fn, q, k, v, cotangent):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(cotangent))


def assert_matches(fn, seq_len):
    q, k, v, cotangent = inputs(seq_len)
    segment_ids = segments(seq_len)
    got = jax.jit(lambda *a: values_and_grads(lambda q, k, v: fn(q, k, v, segment_ids), *a))(q, k, v, cotangent)
    expected = jax.jit(lambda *a: values_and_grads(lambda q, k, v: reference(q, k, v, segment_ids, CAP), *a))(q, k, v, cotangent)
    # float32 rounding of a few chained reductions over T keys and D products (as in
    # test_attention_implementations); tanh's derivative is at most 1, so capping adds no growth.
    tol = 8 * float(jnp.finfo(jnp.float32).eps) * (seq_len + D)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        np.testing.assert_allclose(g, e, atol=tol, rtol=tol, err_msg=name)
    uncapped = reference(q, k, v, segment_ids, 1e6)
    assert float(jnp.max(jnp.abs(uncapped - expected[0]))) > 100 * tol  # the cap is not a no-op here


@pytest.mark.parametrize("implementation", ["blocked", "xla"])
def test_cpu_implementations_soft_cap_scores_in_values_and_gradients(implementation):
    assert_matches(lambda q, k, v, s: dot_product_attention(
        q, k, v, segment_ids=s, implementation=implementation, logit_softcap=CAP, block_size=16 if implementation == "blocked" else None
    ), T)


def test_attend_soft_caps_scores_under_an_explicit_mask():
    assert_matches(lambda q, k, v, s: attend(q, k, v, attention_mask(T, s), logit_softcap=CAP), T)


def test_splash_kernel_interpreted_soft_caps_scores():
    assert_matches(lambda q, k, v, s: splash_attention(q, k, v, s, block_size=SPLASH_BLOCK, interpret=True, logit_softcap=CAP), SPLASH_T)


@pytest.mark.parametrize("name", ["cudnn", "pallas_gpu"])
def test_kernels_that_cannot_soft_cap_are_refused_by_name(name):
    shape = dict(seq_len=256, head_dim=64, dtype=jnp.bfloat16, has_segments=True)
    assert resolve_implementation(name, HOPPER, **shape) == name  # runnable without a cap
    with pytest.raises(AttentionImplementationError, match=rf"{name!r} cannot run .*: it cannot soft-cap attention scores \(logit_softcap\)"):
        resolve_implementation(name, HOPPER, **shape, logit_softcap=True)
    assert resolve_implementation("auto", HOPPER, **shape, logit_softcap=True) == "xla"
    assert resolve_implementation("auto", Platform("tpu"), **shape, logit_softcap=True) == "splash"


def test_a_cap_must_be_positive():
    q, k, v, _ = inputs(8)
    with pytest.raises(ValueError, match="logit_softcap must be a positive number"):
        dot_product_attention(q, k, v, logit_softcap=0.0)


@pytest.mark.skipif(jax.default_backend() != "tpu", reason="the splash kernel itself runs only on a TPU")
def test_splash_on_a_tpu_soft_caps_scores_in_bfloat16():
    q, k, v, _ = (x.astype(jnp.bfloat16) for x in inputs(SPLASH_T))
    segment_ids = segments(SPLASH_T)
    got = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segment_ids, logit_softcap=CAP))(q, k, v)
    expected = reference(*(x.astype(jnp.float32) for x in (q, k, v)), segment_ids, CAP)
    # bfloat16 outputs of unit-scale weighted means: a few of its 2^-8 relative steps.
    np.testing.assert_allclose(np.asarray(got, np.float32), expected, atol=4 * 2.0**-8, rtol=4 * 2.0**-8)
