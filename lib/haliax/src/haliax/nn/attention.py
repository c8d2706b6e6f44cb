"""Scaled dot-product attention with causal and per-document (segment) masking, and GQA."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def attention_mask(seq_len: int, segment_ids: jax.Array | None = None) -> jax.Array:
    """Boolean mask ``[batch or 1, 1, 1, T, S]``: True where query t may attend to key s.

    Causal always; with ``segment_ids`` also only within the same segment, so documents packed
    into one window never see each other.
    """
    position = jnp.arange(seq_len)
    mask = (position[:, None] >= position[None, :])[None, None, None]
    if segment_ids is not None:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        mask = mask & same[:, None, None]
    return mask


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Causal (and, with ``segment_ids``, per-document) attention.

    ``q``: [B, T, H, D]; ``k``, ``v``: [B, T, KV, D] with ``H % KV == 0``. See ``attend``.
    """
    return attend(q, k, v, attention_mask(q.shape[1], segment_ids))


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Attention of ``q`` [B, T, H, D] over ``k``, ``v`` [B, S, KV, D] where ``mask`` (broadcastable
    to [B, KV, H // KV, T, S]) is True.

    Grouped-query attention is done by viewing the query heads as ``[KV, H // KV]`` rather than
    repeating keys and values, so no [B, S, H, D] copy of ``k``/``v`` is made. Scores and softmax
    are float32; the output has ``q``'s dtype. Every query must see at least one key.
    """
    batch, seq_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}).")
    group = num_heads // num_kv_heads
    q = q.reshape(batch, seq_len, num_kv_heads, group, head_dim)
    scale = 1.0 / math.sqrt(head_dim)
    scores = jnp.einsum("btkgd,bskd->bkgts", q * jnp.asarray(scale, q.dtype), k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", weights, v)
    return out.reshape(batch, seq_len, num_heads, head_dim)
