"""A dense layer whose input and output may each span several named dimensions."""

from __future__ import annotations

import math
from typing import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax.module import NamedModule


class Linear(NamedModule):
    """``y = x · W`` contracting the trailing ``len(in_shape)`` dimensions of ``x``.

    ``W`` has shape ``in_shape + out_shape`` so a projection to ``(heads, head_dim)`` keeps the
    heads dimension visible to partitioning instead of hiding it in a flattened matrix.
    No bias: none of our models use one.
    """

    weight: jax.Array
    in_axes: tuple[str, ...] = eqx.field(static=True)
    out_axes: tuple[str, ...] = eqx.field(static=True)

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        *,
        in_axes: Sequence[str],
        out_axes: Sequence[str],
        key: jax.Array,
        init_std: float = 0.02,
        dtype=jnp.float32,
    ):
        in_shape, out_shape = tuple(in_shape), tuple(out_shape)
        if len(in_shape) != len(in_axes) or len(out_shape) != len(out_axes):
            raise ValueError(f"Linear: shapes {in_shape}->{out_shape} do not match axes {in_axes}->{out_axes}.")
        self.weight = init_std * jax.random.normal(key, in_shape + out_shape, dtype=dtype)
        self.in_axes = tuple(in_axes)
        self.out_axes = tuple(out_axes)

    def param_axes(self):
        return {"weight": self.in_axes + self.out_axes}

    @property
    def in_size(self) -> int:
        return math.prod(self.weight.shape[: len(self.in_axes)])

    def __call__(self, x: jax.Array) -> jax.Array:
        contracted = len(self.in_axes)
        weight = self.weight.astype(x.dtype)
        leading = x.shape[: x.ndim - contracted]
        if len(leading) > 1 and _on_cpu():
            # One row per token on CPU: the weight's gradient then contracts a single leading axis,
            # which XLA's CPU dot takes as it is. Contracting [batch, seq] together, it first
            # copies the output gradient into a transposed [out, batch * seq] array, a pass as slow
            # as the layer's own matmul at small widths (a Llama of hidden 128 trained ~8% faster
            # without those copies). Accelerators contract several axes natively.
            y = jnp.tensordot(x.reshape(-1, *x.shape[x.ndim - contracted:]), weight, axes=contracted)
            return y.reshape(*leading, *y.shape[1:])
        return jnp.tensordot(x, weight, axes=contracted)


def _on_cpu() -> bool:
    """Whether the layer is traced for a CPU: the active mesh's platform, else JAX's default devices'."""
    from haliax.nn.attention_kernels import Platform

    return Platform.current().name == "cpu"
