"""MARS-AdamW (Yuan et al. 2024, "MARS: Unleashing the Power of Variance Reduction for Training
Large Models"): AdamW on a variance-reduced gradient.

Each matrix's gradient ``g`` is corrected with the change since the previous step's,
``c = g + gamma * beta1 / (1 - beta1) * (g - g_prev)``, scaled down to norm 1 when its norm is
above 1 (per matrix, per stacked copy), and ``c`` takes the gradient's place in both Adam moments.
This is the authors' approximate MARS: ``g_prev`` is the previous step's gradient, on the previous
batch, so no second gradient is computed. Vectors (norm scales, biases) get plain AdamW with their
own betas, as in the authors' code. Memory: AdamW's two moments plus the previous gradient (1.5x
AdamW's optimizer state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.matrix_layout import matrix_layouts


class MarsState(NamedTuple):
    count: jax.Array
    mu: Any
    nu: Any
    previous_grad: Any


def scale_by_mars(
    *, b1: float, b2: float, gamma: float, eps: float, vector_b1: float, vector_b2: float, param_axes: ParamAxes | None = None
) -> optax.GradientTransformation:
    def init(params):
        zeros = lambda: optax.tree.zeros_like(params)  # noqa: E731
        return MarsState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros(), previous_grad=zeros())

    def update(grads, state, params=None):
        count = optax.safe_increment(state.count)

        def leaf(g, m, v, previous, layout):
            if layout.is_matrix_shaped:
                beta1, beta2 = b1, b2
                c = g + (gamma * b1 / (1 - b1)) * (g - previous)
                per_copy = tuple(d for d in range(g.ndim) if d not in layout.stack)
                norm = jnp.sqrt(jnp.sum(jnp.square(c), axis=per_copy, keepdims=True))
                c = c / jnp.maximum(norm, 1.0)
            else:
                beta1, beta2, c = vector_b1, vector_b2, g
            m = beta1 * m + (1 - beta1) * c
            v = beta2 * v + (1 - beta2) * jnp.square(c)
            m_hat = m / (1 - beta1**count).astype(m.dtype)
            v_hat = v / (1 - beta2**count).astype(v.dtype)
            return m_hat / (jnp.sqrt(v_hat) + eps), m, v

        layouts = matrix_layouts(grads, param_axes)
        out = jax.tree.map(leaf, grads, state.mu, state.nu, state.previous_grad, layouts)
        pick = lambda i: jax.tree.map(lambda _, o: o[i], grads, out)  # noqa: E731
        return pick(0), MarsState(count=count, mu=pick(1), nu=pick(2), previous_grad=grads)

    return optax.GradientTransformation(init, update)


@OptimizerConfig.register("mars")
@dataclass(frozen=True, kw_only=True)
class MarsConfig(OptimizerConfig):
    """``gamma`` sets the strength of the correction (0: AdamW with norm-clipped gradients)."""

    beta1: float = 0.95
    beta2: float = 0.99
    gamma: float = 0.025
    epsilon: float = 1e-8
    # Plain AdamW for vectors (norm scales, biases), as the authors' optimize_1d=False.
    vector_beta1: float = 0.9
    vector_beta2: float = 0.95

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2", "vector_beta1", "vector_beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.95")
        require(self, "gamma", lambda v: v >= 0, "a finite number >= 0, e.g. 0.025")
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-8 (with 0, a zero gradient gives 0/0)")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        return optax.chain(
            self._clipping(),
            scale_by_mars(
                b1=self.beta1, b2=self.beta2, gamma=self.gamma, eps=self.epsilon,
                vector_b1=self.vector_beta1, vector_b2=self.vector_beta2, param_axes=param_axes,
            ),
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),
        )
