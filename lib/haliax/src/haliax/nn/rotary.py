"""Rotary position embeddings (RoPE), in the "rotate halves" layout.

The head dimension is split into two halves that are rotated against each other, which is the
layout Hugging Face Llama checkpoints use; keeping it means weights convert without permutation.

A :class:`RopeScaling` stretches the rotation frequencies, the way models extended past their
pretraining context (Llama 3.1 and later, linearly interpolated fine-tunes) were trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

ROPE_SCALING_TYPES = ("linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE's inverse frequencies are rescaled; ``rope_type`` names the rule.

    - ``"linear"``: every frequency divided by ``factor``, i.e. positions compressed ``factor``-fold.
    - ``"llama3"`` (Llama 3.1): components whose wavelength exceeds
      ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those shorter
      than ``original_max_position_embeddings / high_freq_factor`` are kept, and the band between
      blends the two linearly in ``original_max_position_embeddings / wavelength``, so that short-range
      resolution is untouched while long wavelengths cover the longer context.

    The last three fields matter only to ``"llama3"``; their defaults are Llama 3.1's.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(f"RopeScaling.rope_type must be one of {ROPE_SCALING_TYPES}, got {self.rope_type!r}.")
        if not self.factor > 0:
            raise ValueError(f"RopeScaling.factor must be positive, got {self.factor!r}.")
        if self.rope_type == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor!r} and {self.high_freq_factor!r}."
            )
        if self.rope_type == "llama3" and not self.original_max_position_embeddings > 0:
            raise ValueError(
                f"RopeScaling.original_max_position_embeddings must be positive, got {self.original_max_position_embeddings!r}."
            )

    def rescale(self, inv_freq: jax.Array) -> jax.Array:
        """The rescaled inverse frequencies (radians per position), same shape and dtype."""
        if self.rope_type == "linear":
            return inv_freq / self.factor
        context = self.original_max_position_embeddings
        wavelength = 2 * math.pi / inv_freq
        # 0 where the wavelength is long (fully scaled), 1 where it is short (kept), linear between.
        kept = (context / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        kept = jnp.where(wavelength > context / self.low_freq_factor, 0.0, kept)
        kept = jnp.where(wavelength < context / self.high_freq_factor, 1.0, kept)
        return (1 - kept) * inv_freq / self.factor + kept * inv_freq


def rotary_cos_sin(
    positions: jax.Array, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables of shape ``positions.shape + (head_dim,)``, in float32."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}.")
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if scaling is not None:
        inv_freq = scaling.rescale(inv_freq)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x[..., seq, heads, head_dim]`` by tables of shape ``[..., seq, head_dim]``.

    The tables are computed in float32 (:func:`rotary_cos_sin`: angles of positions in the
    thousands lose their phase in bfloat16); the rotation itself runs in ``x``'s dtype. For
    bfloat16 ``x`` that rounds the cos/sin values and the two products (an error of a bfloat16
    step or two, the size of the rounding ``x`` itself came with) instead of rounding once: on a
    TPU the float32 version made XLA write the rotated halves of q and k to memory in float32 in
    every layer, forward and backward, and the whole layer moved 22% more bytes
    (``bench/tpu_kernels.py``; llama_600m, 9.0 GB against 7.0 GB per layer at batch 8 x 2048).
    """
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[..., None, :].astype(x.dtype), sin[..., None, :].astype(x.dtype)
    return x * cos + rotated * sin
