"""On a TPU chip: attention as a model there runs it (splash, through the public entry point) equals
plain masked softmax attention, in values and gradients, in bfloat16 and float32, with packed
documents, grouped-query attention and soft-capped scores, at whatever matmul precision is in force
(``make test-tpu`` runs this file at the default precision and again under "highest").

Tolerances come from the arithmetic: the platform's rounding of matmul operands at the precision in
force (``haliax.numerics.matmul_rounding``: bfloat16's on a TPU at the default, float32's under
"highest") times the length of the reductions each value passes through. Skipped off a TPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax.nn import dot_product_attention
from haliax.nn.attention import resolve_implementation
from haliax.nn.attention_kernels import Platform
from haliax.numerics import matmul_rounding
from haliax.partitioning import make_mesh, use_mesh

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU chip (make test-tpu runs it on one)"),
]

B, T, H, KV, D = 2, 512, 4, 2, 128
DOCUMENT_LENGTHS = ([100, 3, 200, 1], [512])


def segments() -> jax.Array:
    rows = [np.repeat(np.arange(len(lengths)), [*lengths[:-1], T - sum(lengths[:-1])]) for lengths in DOCUMENT_LENGTHS]
    return jnp.asarray(np.stack(rows), jnp.int32)


def inputs(dtype):
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (B, T, H, D), dtype)
    k = jax.random.normal(keys[1], (B, T, KV, D), dtype)
    v = jax.random.normal(keys[2], (B, T, KV, D), dtype)
    return q, k, v, jax.random.normal(keys[3], (B, T, H, D), dtype)


def values_and_grads(fn, q, k, v, cotangent):
    def run(q, k, v, cotangent):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(cotangent.astype(out.dtype)))

    return jax.jit(run)(q, k, v, cotangent)


def reference_values_and_grads(q, k, v, cotangent, segment_ids, cap=None):
    """Float32 masked softmax attention at the highest precision, computed on the CPU (an independent
    device and compiler)."""
    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(np.asarray(x, np.float32), cpu) for x in (q, k, v, cotangent)]
    segment_ids = jax.device_put(np.asarray(segment_ids), cpu)
    with jax.default_device(cpu):
        return jax.jit(lambda q, k, v, c: _with_vjp(lambda q, k, v: reference(q, k, v, segment_ids, cap), q, k, v, c))(*args)


def reference(q, k, v, segment_ids, cap):
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") / np.sqrt(D)
    if cap is not None:
        scores = cap * jnp.tanh(scores / cap)
    causal = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
    mask = causal & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", weights, v, precision="highest")


def _with_vjp(fn, q, k, v, cotangent):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(cotangent))


def tolerance(dtype) -> float:
    """Relative to each result's largest value. Two sources: the rounding of matmul operands and
    results (the precision in force for float32 operands, bfloat16's own for bfloat16 inputs and
    outputs), a few of them chained through the backward (16 units); and float32 accumulation over
    up to T keys or D products, as on a CPU (8 eps per term, the worst case, linear)."""
    unit = max(matmul_rounding(dtype), matmul_rounding(jnp.float32))
    if jnp.dtype(dtype).itemsize <= 2:
        unit = max(unit, matmul_rounding(jnp.bfloat16))
    return 16 * unit + 8 * float(jnp.finfo(jnp.float32).eps) * (T + D)


def assert_close(got, expected, dtype):
    tol = tolerance(dtype)
    for label, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        g, e = np.asarray(g, np.float32), np.asarray(e, np.float32)
        assert g.shape == e.shape, label
        assert np.isfinite(g).all(), label
        np.testing.assert_allclose(g, e, atol=tol * np.abs(e).max(), rtol=0, err_msg=f"{label} ({jnp.dtype(dtype).name})")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("cap", [None, 30.0], ids=["plain", "softcap"])
def test_auto_attention_on_a_tpu_is_splash_and_equals_masked_softmax(dtype, cap):
    segment_ids = segments()
    q, k, v, cotangent = inputs(dtype)
    chosen = resolve_implementation("auto", Platform.current(), seq_len=T, head_dim=D, dtype=dtype, has_segments=True,
                                    logit_softcap=cap is not None)
    assert chosen == "splash"
    got = values_and_grads(lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segment_ids, logit_softcap=cap), q, k, v, cotangent)
    assert got[0].dtype == dtype
    assert_close(got, reference_values_and_grads(q, k, v, cotangent, segment_ids, cap), dtype)


def test_splash_under_a_mesh_runs_per_shard_and_equals_masked_softmax():
    segment_ids = segments()
    q, k, v, cotangent = inputs(jnp.bfloat16)
    mesh = make_mesh(data=-1)

    def sharded(q, k, v):
        with use_mesh(mesh):
            return dot_product_attention(q, k, v, segment_ids=segment_ids, implementation="splash")

    assert_close(values_and_grads(sharded, q, k, v, cotangent), reference_values_and_grads(q, k, v, cotangent, segment_ids), jnp.bfloat16)


def test_splash_trains_under_every_precision_a_user_can_set():
    """A numerics check run under "highest" (or "high") still trains: bfloat16 splash compiles and
    matches the plain attention at every precision setting."""
    segment_ids = segments()
    q, k, v, cotangent = inputs(jnp.bfloat16)
    expected = reference_values_and_grads(q, k, v, cotangent, segment_ids)
    for precision in ("default", "high", "highest"):
        with jax.default_matmul_precision(precision):
            got = values_and_grads(lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segment_ids, implementation="splash"),
                                   q, k, v, cotangent)
        assert_close(got, expected, jnp.bfloat16)
