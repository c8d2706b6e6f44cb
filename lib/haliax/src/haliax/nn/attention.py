"""Scaled dot-product attention with causal and per-document (segment) masking, and GQA.

``dot_product_attention`` is the one entry point. Unless the caller names an implementation, it
chooses one at trace time by platform, shape and dtype (``resolve_implementation``):

- ``"blocked"``, the CPU default: query blocks, each over only the keys it can see, unrolled at
  trace time. Fastest on a CPU; on accelerators the unrolled blocks are slow to compile (74 s for
  the tutorial model on a GPU), so it is never chosen there by itself.
- ``"xla"``: one masked [T, T] attention (``attend``); runs anywhere, the accelerators' fallback.
- ``"cudnn"`` (the GPU default where cuDNN applies), ``"pallas_gpu"`` (the GPU fallback) and
  ``"splash"`` (the TPU default): fused kernels, see ``haliax.nn.attention_kernels``.

All of them compute the same thing up to rounding: causal attention that never crosses a document
boundary (``segment_ids``), with grouped-query attention. ``logit_softcap`` (Gemma 2) bounds the
scores to ``(-cap, cap)`` with ``cap * tanh(scores / cap)`` before masking; cuDNN and the Pallas GPU
kernel cannot, so they are refused for it and ``"auto"`` passes them over.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from haliax.errors import HaliaxError
from haliax.nn.attention_kernels import KERNELS, UNSUPPORTED_CHECKS, Platform

IMPLEMENTATIONS = ("auto", "blocked", "xla", "cudnn", "pallas_gpu", "splash")
# What "auto" tries, in order, per platform; the first that supports the shape and dtype runs.
AUTO_PREFERENCE = {"cpu": ("blocked",), "gpu": ("cudnn", "pallas_gpu", "xla"), "tpu": ("splash", "xla")}

# Kernels with no way to soft-cap the scores inside them.
NO_SOFTCAP = frozenset({"cudnn", "pallas_gpu"})

# Sequences up to this length attend in one block. bench/attention_long_context.py --sweep
# (forward+backward on CPU, head_dim 16, same tokens per batch) found blocking faster from
# T=128 up: 18 ms with blocks of 64 vs 26 ms for one masked [T, T] attention at T=128, and
# 206 ms with blocks of 128 vs 751 ms at T=2048.
FULL_ATTENTION_MAX_LEN = 64
# Query-block lengths: small blocks keep one block's float32 scores cache-sized; past ~1k tokens
# the longer key range favours fewer, larger blocks (sweep: 64 best to T=1024, 128 at 2048-4096).
SHORT_QUERY_BLOCK_SIZE = 64
LONG_QUERY_BLOCK_SIZE = 128
LONG_SEQUENCE_MIN_LEN = 1025
# Cap on the number of blocks: the blocks are unrolled at trace time, so very long sequences get
# proportionally larger blocks to keep the compiled program (and compile time) bounded.
MAX_QUERY_BLOCKS = 32
# With packed documents, a query block whose documents all begin within this many query blocks
# before its end attends only to that window of keys (see blocked_attention). Four blocks of
# 128 keys cover stories of a few hundred tokens; longer documents take the full key range.
DOCUMENT_WINDOW_BLOCKS = 4


def attention_mask(seq_len: int, segment_ids: jax.Array | None = None) -> jax.Array:
    """Boolean mask ``[batch or 1, 1, 1, T, S]``: True where query t may attend to key s.

    Causal always; with ``segment_ids`` also only within the same segment, so documents packed
    into one window never see each other.
    """
    return _causal_block_mask(0, seq_len, 0, seq_len, segment_ids)


def causal_block_size(seq_len: int) -> int:
    """The query-block length ``blocked_attention`` uses for a sequence of ``seq_len`` tokens.

    ``seq_len`` itself (one block, plain attention) up to ``FULL_ATTENTION_MAX_LEN``; then
    ``SHORT_QUERY_BLOCK_SIZE``, from ``LONG_SEQUENCE_MIN_LEN`` on ``LONG_QUERY_BLOCK_SIZE``, grown
    for very long sequences so that there are at most ``MAX_QUERY_BLOCKS`` blocks.
    """
    if seq_len <= FULL_ATTENTION_MAX_LEN:
        return seq_len
    block = SHORT_QUERY_BLOCK_SIZE if seq_len < LONG_SEQUENCE_MIN_LEN else LONG_QUERY_BLOCK_SIZE
    return max(block, -(-seq_len // MAX_QUERY_BLOCKS))


class AttentionImplementationError(HaliaxError, ValueError):
    """An attention implementation that is unknown, or cannot run on this platform, shape or dtype."""


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    block_size: int | None = None,
    document_window: int | None = None,
    implementation: str = "auto",
    logit_softcap: float | None = None,
) -> jax.Array:
    """Causal (and, with ``segment_ids`` [B, T], per-document) self-attention.

    ``q``: [B, T, H, D]; ``k``, ``v``: [B, T, KV, D] with ``H % KV == 0`` (grouped-query
    attention). Softmax is float32 on every path; the output has ``q``'s dtype.

    ``implementation`` is ``"auto"`` (chosen by platform, shape and dtype) or one of
    ``IMPLEMENTATIONS``; a named one that cannot run here raises ``AttentionImplementationError``
    saying why. ``block_size`` and ``document_window`` tune the ``"blocked"`` implementation
    (see ``blocked_attention``) and are refused with any other. ``logit_softcap``: see the module
    docstring; None leaves the scores as they are.
    """
    batch, seq_len, num_heads, head_dim = q.shape
    if num_heads % k.shape[2]:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({k.shape[2]}).")
    if k.shape[1] != seq_len or v.shape[1] != seq_len:
        raise ValueError(
            f"Self-attention needs as many keys as queries, got q {q.shape}, k {k.shape}, v {v.shape}; "
            "use attend() with an explicit mask for other layouts."
        )
    if segment_ids is not None and segment_ids.shape != (batch, seq_len):
        raise ValueError(f"segment_ids must have shape {(batch, seq_len)}, got {segment_ids.shape}.")
    check_softcap(logit_softcap)
    name = resolve_implementation(
        implementation, Platform.current(), seq_len=seq_len, head_dim=head_dim, dtype=q.dtype, has_segments=segment_ids is not None,
        logit_softcap=logit_softcap is not None,
    )
    if name == "blocked":
        return blocked_attention(
            q, k, v, segment_ids=segment_ids, block_size=block_size, document_window=document_window, logit_softcap=logit_softcap
        )
    if block_size is not None or document_window is not None:
        raise AttentionImplementationError(
            f"block_size and document_window tune the 'blocked' attention implementation; this call uses {name!r}."
        )
    if name == "xla":
        return attend(q, k, v, attention_mask(seq_len, segment_ids), logit_softcap=logit_softcap)
    if logit_softcap is not None:  # only kernels outside NO_SOFTCAP get here with a cap
        return KERNELS[name](q, k, v, segment_ids, logit_softcap=logit_softcap)
    return KERNELS[name](q, k, v, segment_ids)


def check_softcap(logit_softcap: float | None) -> None:
    is_number = isinstance(logit_softcap, (int, float)) and not isinstance(logit_softcap, bool)
    if logit_softcap is not None and not (is_number and logit_softcap > 0):
        raise ValueError(f"logit_softcap must be a positive number or None, got {logit_softcap!r}.")


def resolve_implementation(
    requested: str, platform: Platform, *, seq_len: int, head_dim: int, dtype, has_segments: bool, logit_softcap: bool = False
) -> str:
    """The implementation ``dot_product_attention`` runs for ``requested`` on ``platform``
    (``logit_softcap``: whether the scores are soft-capped).

    ``"auto"`` takes the first of ``AUTO_PREFERENCE[platform.name]`` that supports the shape and
    dtype (``"xla"`` on platforms not listed). A named implementation is returned as is if it can
    run, else refused with the reason and the implementations that could.
    """
    if requested not in IMPLEMENTATIONS:
        raise AttentionImplementationError(f"Unknown attention implementation {requested!r}; expected one of {IMPLEMENTATIONS}.")
    shape = {"seq_len": seq_len, "head_dim": head_dim, "dtype": dtype, "has_segments": has_segments}
    reasons = {name: check(platform, **shape) for name, check in UNSUPPORTED_CHECKS.items()}
    if logit_softcap:
        reasons.update({name: "it cannot soft-cap attention scores (logit_softcap)" for name in NO_SOFTCAP if reasons[name] is None})
    if requested == "auto":
        return next(name for name in (*AUTO_PREFERENCE.get(platform.name, ()), "xla") if reasons.get(name) is None)
    if reasons.get(requested) is not None:
        runnable = [name for name in IMPLEMENTATIONS[1:] if reasons.get(name) is None]
        raise AttentionImplementationError(
            f"Attention implementation {requested!r} cannot run on platform {platform.name!r}: {reasons[requested]}. "
            f"Use 'auto' or one of {runnable}."
        )
    return requested


def blocked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    block_size: int | None = None,
    document_window: int | None = None,
    logit_softcap: float | None = None,
) -> jax.Array:
    """The ``"blocked"`` implementation of ``dot_product_attention`` (same arguments; scores are
    float32 too).

    Blocked causal: the queries are split into blocks of ``block_size`` (default
    ``causal_block_size(T)``) and block ``i`` attends only to the keys ``[0, (i + 1) * block_size)``
    it can see, so the fully-masked upper triangle of the [T, T] scores is never computed, and
    each block's scores are small enough to stay in cache. Every query row's softmax lies inside
    one block, so the result equals plain attention; forward+backward at T=2048 on CPU is several
    times faster than one masked [T, T] attention.

    Packed documents: with ``segment_ids``, a block whose queries share no document with any key
    before the last ``document_window`` keys (default ``DOCUMENT_WINDOW_BLOCKS * block_size``)
    attends only to that window; all the earlier keys are masked for it anyway. Whether a block
    qualifies depends on the data, so each block chooses between the windowed and the full key
    range at run time (``lax.cond``: both are compiled, one runs); shapes stay static and the
    result is the same either way. The chosen branch is recomputed in the backward pass. Measured
    forward+backward at T=2048, 2 heads of 32, on a 2-core CPU (``bench/attention_long_context.py``):
    documents of ~200 tokens 0.13 s instead of 0.24 s; documents longer than the window ~12%
    slower (0.26 s instead of 0.23 s), the price of the recomputation. ``document_window >= T``
    turns windows off.
    """
    seq_len = q.shape[1]
    if block_size is None:
        block_size = causal_block_size(seq_len)
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}.")

    if document_window is None:
        document_window = DOCUMENT_WINDOW_BLOCKS * block_size
    if document_window <= 0:
        raise ValueError(f"document_window must be positive, got {document_window}.")

    def block_over_keys(start: int, stop: int, key_start: int):
        def run():
            mask = _causal_block_mask(start, stop, key_start, stop, segment_ids)
            return attend(q[:, start:stop], k[:, key_start:stop], v[:, key_start:stop], mask, logit_softcap=logit_softcap)

        return run

    outputs = []
    for start in range(0, seq_len, block_size):
        stop = min(start + block_size, seq_len)
        full = block_over_keys(start, stop, 0)
        window_start = stop - document_window
        if segment_ids is None or window_start <= 0:
            outputs.append(full())
            continue
        reaches_back = shares_segment_before(segment_ids, start, stop, window_start)
        # Both branches rematerialised: a cond's backward otherwise keeps the residuals of both
        # (the full branch's scores, zero-filled when unused), which costs more than recomputing.
        windowed = block_over_keys(start, stop, window_start)
        outputs.append(jax.lax.cond(reaches_back, jax.checkpoint(full), jax.checkpoint(windowed)))
    return outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=1)


def shares_segment_before(segment_ids: jax.Array, start: int, stop: int, key_stop: int) -> jax.Array:
    """Whether any query ``start .. stop`` (of any row) is in the same segment as a key before
    ``key_stop``: a scalar bool, exact for any segment numbering."""
    return jnp.any(segment_ids[:, start:stop, None] == segment_ids[:, None, :key_stop])


def _causal_block_mask(
    start: int, stop: int, key_start: int, key_stop: int, segment_ids: jax.Array | None
) -> jax.Array:
    """Mask ``[batch or 1, 1, 1, stop - start, key_stop - key_start]`` for queries ``start .. stop``
    over keys ``key_start .. key_stop``: causal, and within the same segment when ``segment_ids``
    is given."""
    query_positions = jnp.arange(start, stop)
    mask = (query_positions[:, None] >= jnp.arange(key_start, key_stop)[None, :])[None, None, None]
    if segment_ids is not None:
        same = segment_ids[:, start:stop, None] == segment_ids[:, None, key_start:key_stop]
        mask = mask & same[:, None, None]
    return mask


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, logit_softcap: float | None = None) -> jax.Array:
    """Attention of ``q`` [B, T, H, D] over ``k``, ``v`` [B, S, KV, D] where ``mask`` (broadcastable
    to [B, KV, H // KV, T, S]) is True.

    Grouped-query attention is done by viewing the query heads as ``[KV, H // KV]`` rather than
    repeating keys and values, so no [B, S, H, D] copy of ``k``/``v`` is made. Scores and softmax
    are float32; the output has ``q``'s dtype. Every query must see at least one key.
    ``logit_softcap``: scores become ``cap * tanh(scores / cap)`` before the mask (Gemma 2).
    """
    batch, seq_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}).")
    group = num_heads // num_kv_heads
    q = q.reshape(batch, seq_len, num_kv_heads, group, head_dim)
    scale = 1.0 / math.sqrt(head_dim)
    scores = jnp.einsum("btkgd,bskd->bkgts", q * jnp.asarray(scale, q.dtype), k, preferred_element_type=jnp.float32)
    if logit_softcap is not None:
        scores = logit_softcap * jnp.tanh(scores / logit_softcap)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", weights, v)
    return out.reshape(batch, seq_len, num_heads, head_dim).astype(q.dtype)
