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
        return jnp.tensordot(x, self.weight.astype(x.dtype), axes=len(self.in_axes))
