"""Every attention implementation that can run on a CPU equals one plain masked softmax attention,
in values and gradients, with packed documents and grouped-query attention; "auto" picks by
platform; a choice that cannot run here is refused by name.

The accelerator kernels run here in Pallas' interpret mode (the kernel's own program, evaluated
op by op), so their masking, segment-id and GQA plumbing is what is tested, not their speed.
cuDNN cannot run on a CPU: its exact call arguments are evaluated by ``jax.nn``'s XLA
implementation instead. On a GPU or TPU the kernels that run there are also checked as they are,
in bfloat16 (skipped here).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax.nn import AttentionImplementationError, dot_product_attention
from haliax.nn.attention import AUTO_PREFERENCE, IMPLEMENTATIONS, blocked_attention, resolve_implementation
from haliax.nn.attention_kernels import Platform, cudnn_call_arguments, pallas_gpu_attention, splash_attention
from haliax.partitioning import make_mesh, use_mesh

B, H, KV, D = 2, 4, 2, 16  # two query heads per kv head
# Pallas GPU blocks of 32 over T=96 (three of them); splash needs multiples of 128 (two blocks).
T = 96
SPLASH_T, SPLASH_BLOCK = 256, 128
# Documents of uneven lengths (one of a single token) whose boundaries fall inside blocks.
DOCUMENT_LENGTHS = ([5, 30, 1, 40, 20], [64, 32])


def packed_segment_ids(seq_len: int) -> jax.Array:
    """Documents numbered 0, 1, ... per row; the last one of a row takes the rest of the window."""
    rows = [np.repeat(np.arange(len(lengths)), [*lengths[:-1], seq_len - sum(lengths[:-1])]) for lengths in DOCUMENT_LENGTHS]
    return jnp.asarray(np.stack(rows), jnp.int32)


def reference_attention(q, k, v, segment_ids=None):
    """softmax(QK^T / sqrt(d)) V in float32 over a causal (and same-document) mask, k/v repeated per
    query head."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") / np.sqrt(q.shape[-1])
    positions = jnp.arange(q.shape[1])
    mask = positions[:, None] >= positions[None, :]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", weights, v, precision="highest")


def make_inputs(seq_len: int, seed: int = 0):
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(kq, (B, seq_len, H, D))
    k = jax.random.normal(kk, (B, seq_len, KV, D))
    v = jax.random.normal(kv, (B, seq_len, KV, D))
    cotangent = jax.random.normal(kc, (B, seq_len, H, D))
    return q, k, v, cotangent


def values_and_grads(fn, q, k, v, cotangent):
    """(output, dq, dk, dv) for the given output cotangent, forward and backward in one jit."""

    def run(q, k, v, cotangent):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(cotangent.astype(out.dtype)))

    return jax.jit(run)(q, k, v, cotangent)


def tolerance(seq_len: int) -> float:
    """float32 rounding: each value is a few chained reductions (D products per score, then sums
    over up to T keys, forward and backward) of unit-scale terms, so its error is bounded by about
    eps * (T + D) per reduction; 8 of them cover the backward's chain with room to spare."""
    return 8 * float(jnp.finfo(jnp.float32).eps) * (seq_len + D)


def assert_matches_reference(fn, seq_len, segment_ids):
    q, k, v, cotangent = make_inputs(seq_len)
    got = values_and_grads(fn, q, k, v, cotangent)
    expected = values_and_grads(lambda q, k, v: reference_attention(q, k, v, segment_ids), q, k, v, cotangent)
    tol = tolerance(seq_len)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        assert g.shape == e.shape and g.dtype == jnp.float32, name
        np.testing.assert_allclose(g, e, atol=tol, rtol=tol, err_msg=name)


CPU_PATHS = {
    # Through the public entry point, as a model calls it.
    "blocked": lambda segs: lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segs, implementation="blocked"),
    "xla": lambda segs: lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segs, implementation="xla"),
    # The accelerator paths' own plumbing, with the kernels interpreted or swapped as described above.
    "cudnn_arguments": lambda segs: lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, **cudnn_call_arguments(segs), implementation="xla"
    ),
    "pallas_gpu_interpreted": lambda segs: lambda q, k, v: pallas_gpu_attention(q, k, v, segs, interpret=True),
}


@pytest.mark.parametrize("path", sorted(CPU_PATHS))
@pytest.mark.parametrize("with_segments", [False, True], ids=["causal", "documents"])
def test_every_path_equals_masked_softmax_in_values_and_gradients(path, with_segments):
    segment_ids = packed_segment_ids(T) if with_segments else None
    assert_matches_reference(CPU_PATHS[path](segment_ids), T, segment_ids)


@pytest.mark.parametrize("with_segments", [False, True], ids=["causal", "documents"])
def test_splash_kernel_interpreted_equals_masked_softmax_in_values_and_gradients(with_segments):
    segment_ids = packed_segment_ids(SPLASH_T) if with_segments else None

    def splash(q, k, v):
        return splash_attention(q, k, v, segment_ids, block_size=SPLASH_BLOCK, interpret=True)

    assert_matches_reference(splash, SPLASH_T, segment_ids)


@pytest.mark.isolated  # 4 simulated devices: see conftest.py
@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 (simulated) devices")
def test_pallas_kernel_runs_per_shard_under_a_mesh_split_by_batch_and_heads():
    segment_ids = packed_segment_ids(T)
    mesh = make_mesh(data=2, fsdp=1, model=2, devices=jax.devices()[:4])

    def sharded(q, k, v):
        with use_mesh(mesh):
            return pallas_gpu_attention(q, k, v, segment_ids, interpret=True)

    assert_matches_reference(sharded, T, segment_ids)


def can_run_here(name: str, dtype) -> bool:
    try:
        resolve_implementation(name, Platform.current(), seq_len=SPLASH_T, head_dim=D, dtype=dtype, has_segments=True)
    except AttentionImplementationError:
        return False
    return True


@pytest.mark.parametrize("name", ["cudnn", "pallas_gpu", "splash"])
def test_accelerator_kernel_on_its_own_hardware_equals_masked_softmax(name):
    """Runs only where the kernel can run (skipped on a CPU), with bfloat16 inputs as a model there
    computes, through the public entry point."""
    if not can_run_here(name, jnp.bfloat16):
        pytest.skip(f"{name!r} cannot run on platform {Platform.current().name!r}")
    segment_ids = packed_segment_ids(SPLASH_T)
    q, k, v, cotangent = (x.astype(jnp.bfloat16) for x in make_inputs(SPLASH_T))

    def attention(q, k, v):
        return dot_product_attention(q, k, v, segment_ids=segment_ids, implementation=name)

    got = values_and_grads(attention, q, k, v, cotangent)
    expected = values_and_grads(lambda q, k, v: reference_attention(q, k, v, segment_ids), q, k, v, cotangent)
    # bfloat16 rounding of the kernel's matmul operands (probabilities, score gradients) and of its
    # results, with float32 accumulation: a few bfloat16 eps relative to the largest value.
    tol = 8 * float(jnp.finfo(jnp.bfloat16).eps)
    for label, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        g, e = np.asarray(g, np.float32), np.asarray(e, np.float32)
        np.testing.assert_allclose(g, e, atol=tol * np.abs(e).max(), rtol=tol, err_msg=label)


ON_CPU = pytest.mark.skipif(Platform.current().name != "cpu", reason="about what a CPU runs")


@ON_CPU
def test_auto_is_the_blocked_kernel_on_cpu():
    assert resolve_implementation("auto", Platform.current(), seq_len=T, head_dim=D, dtype=jnp.float32, has_segments=True) == "blocked"
    q, k, v, _ = make_inputs(T)
    segment_ids = packed_segment_ids(T)
    auto = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segment_ids))(q, k, v)
    blocked = jax.jit(lambda q, k, v: blocked_attention(q, k, v, segment_ids=segment_ids))(q, k, v)
    np.testing.assert_array_equal(auto, blocked)


H200 = Platform("gpu", (9, 0))
A100 = Platform("gpu", (8, 0))
TPU = Platform("tpu")


@pytest.mark.parametrize(
    "platform, seq_len, head_dim, dtype, expected",
    [
        (H200, 2048, 128, jnp.bfloat16, "cudnn"),  # the shape
        (H200, 2048, 256, jnp.bfloat16, "cudnn"),  # wide heads from Hopper on
        (A100, 2048, 256, jnp.bfloat16, "pallas_gpu"),  # ... but not before
        (H200, 2048, 128, jnp.float32, "pallas_gpu"),  # cuDNN takes only bf16/fp16
        (H200, 2046, 128, jnp.bfloat16, "cudnn"),  # even length: fine for cuDNN's mask
        (H200, 2047, 128, jnp.bfloat16, "xla"),  # odd: neither cuDNN (masked) nor Pallas blocks
        (Platform("gpu", None), 2048, 128, jnp.bfloat16, "pallas_gpu"),  # a GPU without CUDA
        (TPU, 2048, 128, jnp.bfloat16, "splash"),
        (TPU, 2000, 128, jnp.bfloat16, "xla"),  # not a multiple of 128
        (Platform("cpu"), 2048, 128, jnp.bfloat16, "blocked"),
    ],
)
def test_auto_choice_by_platform_shape_and_dtype(platform, seq_len, head_dim, dtype, expected):
    got = resolve_implementation("auto", platform, seq_len=seq_len, head_dim=head_dim, dtype=dtype, has_segments=True)
    assert got == expected
    assert got in (*AUTO_PREFERENCE.get(platform.name, ()), "xla")


@ON_CPU
@pytest.mark.parametrize("choice", ["cudnn", "pallas_gpu", "splash"])
def test_an_accelerator_kernel_named_on_cpu_is_refused_naming_platform_and_choice(choice):
    q, k, v, _ = make_inputs(T)
    with pytest.raises(AttentionImplementationError, match=rf"'{choice}' cannot run on platform 'cpu'.*'blocked', 'xla'"):
        dot_product_attention(q, k, v, implementation=choice)


def test_unknown_choices_and_blocked_only_arguments_are_refused():
    q, k, v, _ = make_inputs(T)
    with pytest.raises(AttentionImplementationError, match="Unknown attention implementation 'flash'"):
        dot_product_attention(q, k, v, implementation="flash")
    with pytest.raises(AttentionImplementationError, match="tune the 'blocked'"):
        dot_product_attention(q, k, v, block_size=16, implementation="xla")
    with pytest.raises(AttentionImplementationError, match="bfloat16 or float16"):
        resolve_implementation("cudnn", H200, seq_len=T, head_dim=D, dtype=jnp.float32, has_segments=False)
    assert set(IMPLEMENTATIONS) == {"auto", "blocked", "xla", "cudnn", "pallas_gpu", "splash"}


def test_cudnn_mask_marks_exactly_the_same_document_pairs():
    segment_ids = packed_segment_ids(T)
    mask = cudnn_call_arguments(segment_ids)["mask"]
    assert mask.shape == (B, 1, T, T) and mask.dtype == jnp.bool_
    for row, lengths in enumerate(DOCUMENT_LENGTHS):
        starts = np.cumsum([0, *lengths[:-1]])
        for start, length in zip(starts, lengths):
            block = np.asarray(mask[row, 0, start : start + length])
            assert block[:, start : start + length].all()
            assert not block[:, :start].any() and not block[:, start + length :].any()
    assert cudnn_call_arguments(None) == {"is_causal": True}
