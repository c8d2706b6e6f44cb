"""Root-mean-square layer normalisation."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax.axes import EMBED
from haliax.module import NamedModule


class RMSNorm(NamedModule):
    """``x / rms(x) * weight`` over the last dimension.

    The statistics are computed in float32 whatever the input dtype: in bfloat16 the mean of
    squares loses enough precision to destabilise training. The output has the input's dtype.
    """

    weight: jax.Array
    eps: float = eqx.field(static=True)

    def __init__(self, dim: int, *, eps: float = 1e-5, dtype=jnp.float32):
        self.weight = jnp.ones((dim,), dtype=dtype)
        self.eps = eps

    def param_axes(self):
        return {"weight": (EMBED,)}

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        normed = (x32 * jax.lax.rsqrt(variance + self.eps)).astype(x.dtype)
        return normed * self.weight.astype(x.dtype)
