"""Blocked causal attention equals plain softmax attention, in values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax.nn import attention as attention_module
from haliax.nn.attention import causal_block_size, dot_product_attention

B, T, H, KV, D = 2, 37, 4, 2, 8  # T is not a multiple of the block sizes below


def reference_attention(q, k, v, segment_ids=None):
    """Explicit softmax attention in float32 with k/v repeated per query head."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") / np.sqrt(q.shape[-1])
    positions = jnp.arange(q.shape[1])
    mask = positions[:, None] >= positions[None, :]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    scores = jnp.where(mask, scores, -jnp.inf)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v, precision="highest")


@pytest.fixture(scope="module")
def inputs():
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(kq, (B, T, H, D))
    k = jax.random.normal(kk, (B, T, KV, D))
    v = jax.random.normal(kv, (B, T, KV, D))
    cotangent = jax.random.normal(kc, (B, T, H, D))
    # Documents of uneven lengths whose boundaries fall inside blocks, different per row.
    segment_ids = jnp.array([np.repeat([0, 1, 2], [5, 20, 12]), np.repeat([3, 4], [30, 7])])
    return q, k, v, cotangent, segment_ids


def values_and_grads(fn, q, k, v, cotangent):
    """(output, dq, dk, dv) for the given output cotangent, forward and backward in one jit."""

    def run(q, k, v, cotangent):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(cotangent.astype(out.dtype)))

    return jax.jit(run)(q, k, v, cotangent)


@pytest.mark.parametrize("block_size", [5, 16, 64])  # 8 uneven blocks, 3 blocks, one block
@pytest.mark.parametrize("with_segments", [False, True], ids=["causal", "segments"])
def test_blocked_equals_reference_in_values_and_gradients(inputs, block_size, with_segments):
    q, k, v, cotangent, segment_ids = inputs
    segs = segment_ids if with_segments else None
    blocked = lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segs, block_size=block_size)  # noqa: E731
    reference = lambda q, k, v: reference_attention(q, k, v, segs)  # noqa: E731
    got = values_and_grads(blocked, q, k, v, cotangent)
    expected = values_and_grads(reference, q, k, v, cotangent)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        assert g.shape == e.shape and g.dtype == jnp.float32, name
        np.testing.assert_allclose(g, e, atol=2e-5, rtol=2e-5, err_msg=name)


@pytest.mark.parametrize("document_window", [1, 7, 12, 30])
def test_document_windows_change_nothing_but_the_work(inputs, document_window):
    # Blocks of 5 over T=37: with short documents some blocks take the windowed key range and
    # the 30-token document forces the full range; the result must not depend on the choice.
    q, k, v, cotangent, segment_ids = inputs
    blocked = lambda q, k, v: dot_product_attention(  # noqa: E731
        q, k, v, segment_ids=segment_ids, block_size=5, document_window=document_window
    )
    got = values_and_grads(blocked, q, k, v, cotangent)
    expected = values_and_grads(lambda q, k, v: reference_attention(q, k, v, segment_ids), q, k, v, cotangent)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        np.testing.assert_allclose(g, e, atol=2e-5, rtol=2e-5, err_msg=name)


def test_which_blocks_may_skip_the_keys_before_their_window():
    from haliax.nn.attention import shares_segment_before

    segments = jnp.array([np.repeat([0, 1, 2], [5, 20, 12])])
    # Queries 30..35 lie in the third document (25..36): keys before 25 are not theirs.
    assert not bool(shares_segment_before(segments, 30, 35, 25))
    # ... but key 24 belongs to the second document, which queries 20..25 are in.
    assert bool(shares_segment_before(segments, 20, 25, 10))
    # Numbering need not increase: a document id reused later still counts as the same document.
    assert bool(shares_segment_before(jnp.array([[7, 3, 3, 7]]), 3, 4, 1))


def test_segments_isolate_documents(inputs):
    q, k, v, _, segment_ids = inputs
    attention = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segment_ids, block_size=8))
    out = attention(q, k, v)
    # Changing the keys/values of row 0's first document (positions 0..4) leaves the later
    # documents' outputs untouched, and changes the first document's.
    out2 = attention(q, k.at[0, :5].add(1.0), v.at[0, :5].add(1.0))
    np.testing.assert_array_equal(out[0, 5:], out2[0, 5:])
    assert not np.allclose(out[0, :5], out2[0, :5])


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_float32(inputs):
    q, k, v, cotangent, segment_ids = inputs
    bf16 = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    blocked = lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segment_ids, block_size=16)  # noqa: E731
    got = values_and_grads(blocked, *bf16, cotangent)
    expected = values_and_grads(lambda q, k, v: reference_attention(q, k, v, segment_ids), *bf16, cotangent)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        assert g.dtype == jnp.bfloat16, name
        np.testing.assert_allclose(np.asarray(g, np.float32), e, atol=0.06, rtol=0.05, err_msg=name)


def test_default_block_size_switches_from_full_to_blocked_attention():
    short = attention_module.FULL_ATTENTION_MAX_LEN
    assert causal_block_size(16) == 16
    assert causal_block_size(short) == short
    assert causal_block_size(short + 1) == attention_module.SHORT_QUERY_BLOCK_SIZE
    assert causal_block_size(2048) == attention_module.LONG_QUERY_BLOCK_SIZE
    very_long = 1 << 20
    assert -(-very_long // causal_block_size(very_long)) <= attention_module.MAX_QUERY_BLOCKS


def test_default_path_is_blocked_and_exact_for_a_long_sequence():
    seq_len = attention_module.FULL_ATTENTION_MAX_LEN + 77
    assert causal_block_size(seq_len) < seq_len
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(kq, (1, seq_len, 2, 4))
    k = jax.random.normal(kk, (1, seq_len, 1, 4))
    v = jax.random.normal(kv, (1, seq_len, 1, 4))
    segment_ids = (jnp.arange(seq_len) >= 300).astype(jnp.int32)[None]
    got = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segment_ids))(q, k, v)
    np.testing.assert_allclose(got, reference_attention(q, k, v, segment_ids), atol=2e-5)


def test_bad_shapes_are_refused_with_a_clear_message(inputs):
    q, k, v, _, _ = inputs
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dot_product_attention(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="as many keys as queries"):
        dot_product_attention(q, k[:, :5], v[:, :5])
    with pytest.raises(ValueError, match="segment_ids must have shape"):
        dot_product_attention(q, k, v, segment_ids=jnp.zeros((B, T + 1), jnp.int32))
    with pytest.raises(ValueError, match="block_size must be positive"):
        dot_product_attention(q, k, v, block_size=0)


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 (simulated) devices")
def test_blocked_attention_under_data_and_head_sharding(inputs):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    q, k, v, _, segment_ids = inputs
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    heads = NamedSharding(mesh, P("data", None, "model", None))
    q_s, k_s, v_s = (jax.device_put(x, heads) for x in (q, k, v))
    segs = jax.device_put(segment_ids, NamedSharding(mesh, P("data", None)))
    fn = jax.jit(lambda q, k, v, s: dot_product_attention(q, k, v, segment_ids=s, block_size=8))
    got = fn(q_s, k_s, v_s, segs)
    assert got.sharding.spec == P("data", None, "model", None) or got.sharding.is_equivalent_to(heads, got.ndim)
    np.testing.assert_allclose(got, reference_attention(q, k, v, segment_ids), atol=2e-5)


def test_document_windows_under_a_batch_sharded_jit(inputs):
    # The per-block choice is a collective decision across the batch: sharding the batch over
    # devices must give the same values as one device.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    q, k, v, cotangent, segment_ids = inputs
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    sharded = [jax.device_put(x, rows) for x in (q, k, v, cotangent, segment_ids)]

    def attention(segs):
        return lambda q, k, v: dot_product_attention(q, k, v, segment_ids=segs, block_size=5, document_window=12)  # noqa: E731

    got = values_and_grads(attention(sharded[4]), *sharded[:4])
    expected = values_and_grads(attention(segment_ids), q, k, v, cotangent)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5, err_msg=name)
