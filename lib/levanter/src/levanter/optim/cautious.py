"""The cautious mask (Liang et al. 2024, "Cautious Optimizers: Improving Training with One Line of
Code"): keep the components of an optimizer's update whose sign agrees with the gradient's, zero
the others, and scale the kept ones by ``n / (kept + 1)`` so the update's size stays about the same.

``n`` counts one stacked copy of the parameter (one layer of a ``layers``-stacked weight), as if
each copy were a parameter of its own, which is what it is in the authors' per-tensor code. The
mask does not touch the optimizer's state: only the update leaving it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import ParamAxes
from levanter.optim.matrix_layout import matrix_layouts


def with_cautious_mask(inner: optax.GradientTransformation, param_axes: ParamAxes | None = None) -> optax.GradientTransformationExtraArgs:
    """``inner`` (the optimizer's scaling, before weight decay and the learning rate) with its updates masked."""
    inner = optax.with_extra_args_support(inner)

    def update(grads, state, params=None, **extra_args):
        updates, state = inner.update(grads, state, params, **extra_args)
        layouts = matrix_layouts(grads, param_axes)
        return jax.tree.map(_masked, updates, grads, layouts), state

    return optax.GradientTransformationExtraArgs(inner.init, update)


def _masked(update: jax.Array, grad: jax.Array, layout) -> jax.Array:
    agrees = (update * grad > 0).astype(update.dtype)
    per_copy = tuple(d for d in range(update.ndim) if d not in layout.stack)
    size = 1
    for d in per_copy:
        size *= update.shape[d]
    kept = jnp.sum(agrees, axis=per_copy, keepdims=True)
    return update * agrees * (size / (kept + 1))
