"""SOAP (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam"): Adam run in the
eigenbasis of Shampoo's preconditioner.

For each matrix ``G`` (``[fan_in, fan_out]``, one per stacked copy, see
:mod:`levanter.optim.matrix_layout`) it keeps Shampoo's statistics ``L = EMA(G Gᵀ)`` and
``R = EMA(Gᵀ G)`` and their eigenvectors ``Q_L``, ``Q_R``. Each step rotates the gradient into
that basis (``Q_Lᵀ G Q_R``), keeps Adam's second moment there, and rotates the Adam step back;
the first moment lives in the original basis. The bases are refreshed every
``precondition_frequency`` steps by one power-iteration step and a QR decomposition (the full
eigendecomposition only at the start), and Adam's second moment is permuted to follow the
reordered eigenvectors. A side longer than ``max_precond_dim`` (e.g. a vocabulary) keeps the
identity basis; vectors are plain Adam.

As in the authors' code, the first step only measures the gradient to set up the bases and moves
no weight, and Adam's bias correction then counts from the second step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.matrix_layout import MatrixLayout, matrix_layouts


class SoapState(NamedTuple):
    count: jax.Array  # steps taken, int32
    mu: Any  # first moment, shaped like the params (original basis)
    nu: Any  # second moment, shaped like the params (in the eigenbasis)
    # Per parameter a pair (fan-in side, fan-out side), each [copies, d, d] or None (no preconditioning).
    stats: Any
    bases: Any


def _sides(layout: MatrixLayout, max_dim: int) -> tuple[int | None, int | None]:
    """The sizes of the preconditioned sides, None for a side left in the identity basis."""
    if not layout.is_matrix_shaped:
        return None, None
    m, n = layout.fan_in_size, layout.fan_out_size
    return (m if m <= max_dim else None), (n if n <= max_dim else None)


def _rotate(x: jax.Array, q_in, q_out, *, back: bool = False) -> jax.Array:
    """``Q_inᵀ x Q_out`` (into the eigenbasis) or ``Q_in x Q_outᵀ`` (back), for ``x`` [copies, m, n]."""
    if q_in is not None:
        x = (q_in if back else jnp.swapaxes(q_in, -1, -2)) @ x
    if q_out is not None:
        x = x @ (jnp.swapaxes(q_out, -1, -2) if back else q_out)
    return x


def _gram(g: jax.Array, side: int) -> jax.Array:
    return g @ jnp.swapaxes(g, -1, -2) if side == 0 else jnp.swapaxes(g, -1, -2) @ g


def _eigenbasis(stat: jax.Array) -> jax.Array:
    """Eigenvectors of ``stat`` ordered by decreasing eigenvalue."""
    return jnp.linalg.eigh(stat)[1][..., ::-1]


def _refresh(stat: jax.Array, q: jax.Array, nu: jax.Array, side: int) -> tuple[jax.Array, jax.Array]:
    """One power-iteration step on ``stat`` from basis ``q``, columns reordered by their estimated
    eigenvalue (largest first) and orthonormalised by QR; ``nu``'s matching axis follows the order."""
    power = stat @ q
    order = jnp.argsort(-jnp.sum(q * power, axis=-2), axis=-1)
    power = jnp.take_along_axis(power, order[:, None, :], axis=-1)
    nu = jnp.take_along_axis(nu, order[:, :, None] if side == 0 else order[:, None, :], axis=1 + side)
    return jnp.linalg.qr(power)[0], nu


def scale_by_soap(
    layouts, *, b1: float, b2: float, shampoo_beta: float, eps: float, precondition_frequency: int, max_precond_dim: int
) -> optax.GradientTransformation:
    """SOAP's update direction (times Adam's bias correction), before the learning rate.
    ``layouts``: params -> tree of :class:`MatrixLayout`."""

    def init(params):
        def factors(p, layout):
            shapes = [None if d is None else (layout.copies, d, d) for d in _sides(layout, max_precond_dim)]
            return tuple(None if s is None else jnp.zeros(s, jnp.float32) for s in shapes)

        stats = jax.tree.map(factors, params, layouts(params))
        return SoapState(
            count=jnp.zeros([], jnp.int32),
            mu=optax.tree.zeros_like(params),
            nu=optax.tree.zeros_like(params),
            stats=stats,
            bases=stats,
        )

    def update(updates, state, params=None):
        del params
        t = state.count

        def one(g, mu, nu, stats, bases, layout):
            gm = layout.to_matrix(g).astype(jnp.float32)
            stats = tuple(
                None if s is None else shampoo_beta * s + (1 - shampoo_beta) * _gram(gm, side)
                for side, s in enumerate(stats)
            )

            def first_step():
                fresh = tuple(None if s is None else _eigenbasis(s) for s in stats)
                return jnp.zeros_like(g), mu, nu, fresh

            def later_step():
                q_in, q_out = bases
                mu_new = b1 * mu + (1 - b1) * g
                nu_m = b2 * layout.to_matrix(nu) + (1 - b2) * jnp.square(_rotate(gm, q_in, q_out))
                direction = _rotate(_rotate(layout.to_matrix(mu_new), q_in, q_out) / (jnp.sqrt(nu_m) + eps), q_in, q_out, back=True)
                correction = jnp.sqrt(1 - b2 ** t.astype(jnp.float32)) / (1 - b1 ** t.astype(jnp.float32))

                def refreshed():
                    new_bases, nu_r = [], nu_m
                    for side, (s, q) in enumerate(zip(stats, bases)):
                        if s is None:
                            new_bases.append(None)
                        else:
                            q, nu_r = _refresh(s, q, nu_r, side)
                            new_bases.append(q)
                    return tuple(new_bases), nu_r

                due = (t % precondition_frequency) == 0
                new_bases, nu_m = jax.lax.cond(due, refreshed, lambda: (bases, nu_m))
                return layout.from_matrix(direction * correction).astype(g.dtype), mu_new, layout.from_matrix(nu_m), new_bases

            direction, mu, nu, bases = jax.lax.cond(t == 0, first_step, later_step)
            return direction, mu, nu, stats, bases

        # One call of ``one`` per parameter: every state tree is flattened down to the params' leaves.
        treedef = jax.tree.structure(updates)
        trees = (updates, state.mu, state.nu, state.stats, state.bases, layouts(updates))
        results = [one(*args) for args in zip(*(treedef.flatten_up_to(tree) for tree in trees))]
        pick = lambda i: treedef.unflatten([r[i] for r in results])  # noqa: E731
        new_state = SoapState(count=optax.safe_increment(t), mu=pick(1), nu=pick(2), stats=pick(3), bases=pick(4))
        return pick(0), new_state

    return optax.GradientTransformation(init, update)


@OptimizerConfig.register("soap")
@dataclass(frozen=True, kw_only=True)
class SOAPConfig(OptimizerConfig):
    """SOAP; defaults are the authors' (and pytorch-optimizer's)."""

    beta1: float = 0.95
    beta2: float = 0.95
    # Decay of the Shampoo statistics; None: beta2.
    shampoo_beta: float | None = None
    epsilon: float = 1e-8
    precondition_frequency: int = 10
    max_precond_dim: int = 10000

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.95")
        require(self, "shampoo_beta", lambda v: 0 <= v < 1, "a number in [0, 1), or None for beta2", optional=True)
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-8")
        whole = lambda v: v >= 1 and float(v).is_integer()  # noqa: E731
        require(self, "precondition_frequency", whole, "a whole number of steps >= 1, e.g. 10")
        require(self, "max_precond_dim", whole, "a whole number >= 1, e.g. 10000")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        soap = scale_by_soap(
            lambda tree: matrix_layouts(tree, param_axes),
            b1=self.beta1,
            b2=self.beta2,
            shampoo_beta=self.beta2 if self.shampoo_beta is None else self.shampoo_beta,
            eps=self.epsilon,
            precondition_frequency=int(self.precondition_frequency),
            max_precond_dim=int(self.max_precond_dim),
        )
        return optax.chain(self._clipping(), soap, self._decay(weight_decay_mask, param_axes), self._learning_rate(num_train_steps))
