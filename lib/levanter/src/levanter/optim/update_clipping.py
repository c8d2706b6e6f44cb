"""Update clipping by RMS: scale each parameter's update down so that its root mean square is at
most a bound, ``u / max(1, rms(u) / bound)`` (Adafactor's update clipping).

``optax.clip_by_block_rms`` does this per array; here a parameter stacked over ``layers`` or
``experts`` is clipped per copy, so one layer's large step is not diluted by the other layers', and
a scanned model is clipped as the same model with its layers unrolled would be.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import ParamAxes
from levanter.optim.matrix_layout import matrix_layouts


def clip_update_rms(bound: float, param_axes: ParamAxes | None = None) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        del params
        layouts = matrix_layouts(updates, param_axes)
        return jax.tree.map(lambda u, layout: _clipped(u, layout.stack, bound), updates, layouts), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _clipped(u: jax.Array, stack: tuple[int, ...], bound: float) -> jax.Array:
    per_copy = tuple(d for d in range(u.ndim) if d not in stack)
    rms = jnp.sqrt(jnp.mean(jnp.square(u), axis=per_copy, keepdims=True))
    return u / jnp.maximum(1.0, rms / bound).astype(u.dtype)
