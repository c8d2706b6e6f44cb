"""Scion (Pethick et al. 2025, "Training Deep Learning Models with Norm-Constrained LMOs"): each
parameter steps along the linear minimisation oracle (LMO) of a norm chosen for its role, scaled
by a radius, applied to a momentum average of the gradient.

    d <- (1 - momentum) d + momentum g            (``momentum`` weighs the *new* gradient, as in the paper)
    param <- param - lr * radius * lmo(d)         (plus decoupled weight decay on masked-in matrices)

The LMOs, per role (see :mod:`levanter.optim.matrix_layout`), in the paper's GPT recipe:

- hidden matrices: spectral norm, ``lmo(d) = sqrt(fan_out / fan_in) * NS(d)`` (Newton-Schulz);
- embedding: column norm ("ColNorm": each token's vector scaled to RMS 1);
- output head: sign, ``sign(d) / fan_in``;
- vectors: RMS normalisation of the whole vector (per stacked copy).

This is the unconstrained variant (weights are not projected back into the norm ball).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.matrix_layout import MatrixLayout, matrix_layouts
from levanter.optim.newton_schulz import orthogonalize

_EPS = 1e-8  # added to the norms the LMOs divide by, so a zero gradient steps by zero


def lmo(layout: MatrixLayout, d: jax.Array, *, ns_steps: int) -> jax.Array:
    """The LMO direction of ``d`` for a parameter of ``layout`` (unit radius), shaped like ``d``."""
    m = layout.to_matrix(d)  # [copies, fan_in, fan_out]; a vector is [copies, 1, size]
    if layout.role == "matrix":
        out = orthogonalize(m, steps=ns_steps) * (layout.fan_out_size / layout.fan_in_size) ** 0.5
    elif layout.role == "head":
        out = jnp.sign(m) / layout.fan_in_size
    else:  # embedding: each token's vector (a row) to RMS 1; vector: the whole vector to RMS 1
        out = m / (jnp.sqrt(jnp.mean(jnp.square(m), axis=-1, keepdims=True)) + _EPS)
    return layout.from_matrix(out.astype(d.dtype))


def scale_by_lmo(layouts, radii: dict[str, float], *, ns_steps: int) -> optax.GradientTransformation:
    """Replace each update by ``radius[role] * lmo(update)``; stateless."""

    def update(updates, state, params=None):
        del params
        out = jax.tree.map(lambda u, l: radii[l.role] * lmo(l, u, ns_steps=ns_steps), updates, layouts(updates))
        return out, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


@OptimizerConfig.register("scion")
@dataclass(frozen=True, kw_only=True)
class ScionConfig(OptimizerConfig):
    """Scion; radii default to the authors' GPT example (hidden 50, head 50 x 60)."""

    momentum: float = 0.1
    ns_steps: int = 5
    hidden_radius: float = 50.0
    embedding_radius: float = 50.0
    head_radius: float = 3000.0
    vector_radius: float = 50.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, "momentum", lambda v: 0 < v <= 1, "a number in (0, 1], the weight of the new gradient, e.g. 0.1")
        require(self, "ns_steps", lambda v: v >= 1 and float(v).is_integer(), "a whole number >= 1, e.g. 5")
        for radius in ("hidden_radius", "embedding_radius", "head_radius", "vector_radius"):
            require(self, radius, lambda v: v > 0, "a finite number > 0")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        radii = {
            "matrix": self.hidden_radius,
            "embedding": self.embedding_radius,
            "head": self.head_radius,
            "vector": self.vector_radius,
        }
        return optax.chain(
            self._clipping(),
            optax.ema(decay=1.0 - self.momentum, debias=False),
            scale_by_lmo(lambda tree: matrix_layouts(tree, param_axes), radii, ns_steps=int(self.ns_steps)),
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),
        )
