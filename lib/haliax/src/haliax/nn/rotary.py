"""Rotary position embeddings (RoPE), in the "rotate halves" layout.

The head dimension is split into two halves that are rotated against each other, which is the
layout Hugging Face Llama checkpoints use; keeping it means weights convert without permutation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rotary_cos_sin(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables of shape ``positions.shape + (head_dim,)``, in float32."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}.")
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x[..., seq, heads, head_dim]`` by tables of shape ``[..., seq, head_dim]``.

    Computed in float32 (positions up to thousands lose their phase in bfloat16) and returned in
    ``x``'s dtype.
    """
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    cos, sin = cos[..., None, :], sin[..., None, :]
    return (x32 * cos + rotated * sin).astype(x.dtype)
