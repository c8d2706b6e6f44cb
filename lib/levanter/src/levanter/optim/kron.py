"""PSGD Kron (Xi-Lin Li, "Preconditioned Stochastic Gradient Descent"; the Kronecker-factored form
popularised by Evan Walters): momentum preconditioned by ``P = Q_inᵀQ_in ⊗ Q_outᵀQ_out``, with the
factors fitted online to random probes.

Per matrix (``[fan_in, fan_out]``, one per stacked copy, see :mod:`levanter.optim.matrix_layout`)
each factor is upper triangular (a dense ``d x d``), or diagonal when its side is longer than
``max_size_triangular`` (a vocabulary) or the parameter is a vector. On a preconditioner-update
step, with ``M`` the bias-corrected momentum and ``V`` a standard normal probe of its shape, each
factor takes one step of relative gradient descent on the PSGD criterion, whose fixed point
balances ``P M`` against ``P^{-1} V``:

    A = M ×_in Q_in ×_out Q_out,   B = V ×_in Q_in^{-T} ×_out Q_out^{-T}
    Q <- Q - lr_precond * triu(A_(k) A_(k)ᵀ - B_(k) B_(k)ᵀ) / ||A_(k) A_(k)ᵀ + B_(k) B_(k)ᵀ|| · Q

(``X_(k)``: ``X`` unfolded along side ``k``; the norm is a cheap lower bound of the spectral one.)
Updates happen on a deterministic schedule of probability ``p(step)`` (a counter fires every
``1/p`` steps): every step for the first ``flat_start`` steps, then decaying towards
``min_probability``. The step is ``P M``, scaled down if its RMS exceeds 1.1.

The probes come from a key in the optimizer state (``seed``), one stream per step and parameter
(:func:`kron_probe`), so a resumed run draws the same probes as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.matrix_layout import MatrixLayout, matrix_layouts

_TINY = float(jnp.finfo(jnp.float32).tiny)
_BALANCE_EVERY = 100  # preconditioner updates between rebalancings of the factors' scales


class KronState(NamedTuple):
    count: jax.Array  # steps taken, int32
    since_update: jax.Array  # steps since the last preconditioner update, int32
    updates: jax.Array  # preconditioner updates so far, int32
    key: jax.Array  # the probes' key, uint32[2]
    mu: Any  # momentum, shaped like the params
    # Per parameter a tuple of factors, one per side: [copies, d, d] (triangular) or [copies, d] (diagonal).
    factors: Any


def kron_probe(key: jax.Array, count, leaf_index: int, layout: MatrixLayout) -> jax.Array:
    """The random probe of parameter number ``leaf_index`` (in ``jax.tree.leaves`` order) at step
    ``count``: standard normal, ``[copies, fan_in, fan_out]`` (``[copies, size]`` for a vector)."""
    key = jax.random.fold_in(jax.random.fold_in(key, count), leaf_index)
    return jax.random.normal(key, _kron_shape(layout), jnp.float32)


def _kron_shape(layout: MatrixLayout) -> tuple[int, ...]:
    copies, m, n = layout.matrix_shape
    return (copies, m, n) if layout.is_matrix_shaped else (copies, m * n)


def _sides(layout: MatrixLayout) -> tuple[int, ...]:
    return _kron_shape(layout)[1:]


def _mode(x: jax.Array, q: jax.Array, k: int, *, inverse_transpose: bool = False) -> jax.Array:
    """``x`` with side ``k`` multiplied by ``q`` (``Σ_n q[a, n] x[.., n, ..]``), or by ``q^{-T}``;
    ``q`` is a dense upper-triangular factor or the diagonal of one."""
    if q.ndim == 1:
        shape = [1] * x.ndim
        shape[k] = -1
        q = q.reshape(shape)
        return x / q if inverse_transpose else x * q
    front = jnp.moveaxis(x, k, 0)
    flat = front.reshape(front.shape[0], -1)
    if inverse_transpose:
        out = jax.scipy.linalg.solve_triangular(q, flat, trans="T", lower=False)
    else:
        out = q @ flat
    return jnp.moveaxis(out.reshape(front.shape), 0, k)


def _gram(x: jax.Array, k: int, diagonal: bool) -> jax.Array:
    """``x_(k) x_(k)ᵀ``, or only its diagonal."""
    front = jnp.moveaxis(x, k, 0).reshape(x.shape[k], -1)
    return jnp.sum(front * front, axis=1) if diagonal else front @ front.T


def _norm_lower_bound(a: jax.Array) -> jax.Array:
    """A lower bound of the spectral norm of the symmetric matrix ``a``, within a small factor of
    it: one power-iteration step from its largest row or column (Li's estimator)."""
    max_abs = jnp.max(jnp.abs(a))
    a = a / jnp.where(max_abs > 0, max_abs, 1.0)
    aa = a * a
    col_sums, row_sums = jnp.sum(aa, axis=0), jnp.sum(aa, axis=1)
    x0 = a[:, jnp.argmax(col_sums)] @ a
    bound0 = jnp.linalg.norm(a @ (x0 / jnp.maximum(jnp.linalg.norm(x0), _TINY)))
    x1 = a @ a[jnp.argmax(row_sums), :]
    bound1 = jnp.linalg.norm(a.T @ (x1 / jnp.maximum(jnp.linalg.norm(x1), _TINY)))
    return max_abs * jnp.where(jnp.max(col_sums) > jnp.max(row_sums), bound0, bound1)


def _fit_factors(factors: tuple, m: jax.Array, v: jax.Array, lr: float) -> tuple:
    """One step of every factor towards balancing ``P m`` against ``P^{-1} v`` (one copy)."""
    a, b = m, v
    for k, q in enumerate(factors):
        a = _mode(a, q, k)
        b = _mode(b, q, k, inverse_transpose=True)
    fitted = []
    for k, q in enumerate(factors):
        diagonal = q.ndim == 1
        term1, term2 = _gram(a, k, diagonal), _gram(b, k, diagonal)
        if diagonal:
            step = lr * (term1 - term2) * q / (jnp.max(jnp.abs(term1 + term2)) + _TINY)
        else:
            step = (lr * jnp.triu(term1 - term2) / (_norm_lower_bound(term1 + term2) + _TINY)) @ q
        fitted.append(q - step)
    return tuple(fitted)


def _balance(factors: tuple) -> tuple:
    """The same preconditioner with every factor's largest entry equal (their geometric mean)."""
    norms = jnp.stack([jnp.max(jnp.abs(q)) for q in factors])
    mean = jnp.prod(norms) ** (1.0 / len(factors))
    return tuple(q * (mean / norms[i]) for i, q in enumerate(factors))


def _precondition(factors: tuple, m: jax.Array) -> jax.Array:
    """``P m`` with ``P = ⊗ QᵀQ``, the step capped at RMS 1.1 (one copy)."""
    for k, q in enumerate(factors):
        m = _mode(m, q.T @ q if q.ndim == 2 else q * q, k)
    return m * jnp.minimum(1.1 / (jnp.sqrt(jnp.mean(jnp.square(m))) + 1e-6), 1.0)


def update_probability(step, *, fixed: float | None, flat_start: int, decay: float, min_probability: float):
    """The chance of a preconditioner update at ``step`` (0-based): ``fixed``, or 1 for
    ``flat_start`` steps then ``exp(-decay * (step - flat_start))``, never below ``min_probability``."""
    if fixed is not None:
        return jnp.asarray(fixed, jnp.float32)
    p = jnp.exp(-decay * (jnp.asarray(step, jnp.float32) - flat_start))
    return jnp.clip(p, min_probability, 1.0)


def scale_by_kron(
    layouts,
    *,
    b1: float,
    precondition_lr: float,
    init_scale: float,
    max_size_triangular: int,
    probability: dict[str, Any],
    seed: int,
) -> optax.GradientTransformation:
    """Kron's preconditioned momentum, before the learning rate. ``layouts``: params -> tree of :class:`MatrixLayout`."""

    def init(params):
        def factors(p, layout):
            copies, sides = layout.copies, _sides(layout)
            scale = init_scale ** (1.0 / len(sides))
            out = []
            for d in sides:
                dense = layout.is_matrix_shaped and 1 < d <= max_size_triangular
                q = scale * (jnp.eye(d, dtype=jnp.float32) if dense else jnp.ones((d,), jnp.float32))
                out.append(jnp.broadcast_to(q, (copies, *q.shape)))
            return tuple(out)

        return KronState(
            count=jnp.zeros([], jnp.int32),
            since_update=jnp.zeros([], jnp.int32),
            updates=jnp.zeros([], jnp.int32),
            key=jax.random.PRNGKey(seed),
            mu=optax.tree.zeros_like(params),
            factors=jax.tree.map(factors, params, layouts(params)),
        )

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        prob = update_probability(state.count, **probability)
        since = state.since_update + 1
        do_update = (prob > 0) & (since.astype(jnp.float32) >= 1.0 / prob)
        balance = do_update & (state.updates > 0) & (state.updates % _BALANCE_EVERY == 0)
        correction = 1 - b1 ** count.astype(jnp.float32)

        def one(index, g, mu, factors, layout):
            mu = b1 * mu + (1 - b1) * g
            m = layout.to_matrix(mu / correction).astype(jnp.float32).reshape(_kron_shape(layout))

            def fitted(factors):
                factors = jax.lax.cond(balance, jax.vmap(_balance), lambda f: f, factors)
                probe = kron_probe(state.key, state.count, index, layout)
                return jax.vmap(lambda f, a, v: _fit_factors(f, a, v, precondition_lr))(factors, m, probe)

            factors = jax.lax.cond(do_update, fitted, lambda f: f, factors)
            step = jax.vmap(_precondition)(factors, m)
            return layout.from_matrix(step.reshape(layout.matrix_shape)).astype(g.dtype), mu, factors

        treedef = jax.tree.structure(updates)
        trees = (updates, state.mu, state.factors, layouts(updates))
        results = [one(i, *args) for i, args in enumerate(zip(*(treedef.flatten_up_to(t) for t in trees)))]
        pick = lambda i: treedef.unflatten([r[i] for r in results])  # noqa: E731
        new_state = KronState(
            count=count,
            since_update=jnp.where(do_update, 0, since),
            updates=state.updates + do_update.astype(jnp.int32),
            key=state.key,
            mu=pick(1),
            factors=pick(2),
        )
        return pick(0), new_state

    return optax.GradientTransformation(init, update)


@OptimizerConfig.register("kron")
@dataclass(frozen=True, kw_only=True)
class KronConfig(OptimizerConfig):
    """PSGD Kron; defaults as in the Kron implementations (psgd_jax, kron_torch, pytorch-optimizer)."""

    beta1: float = 0.9
    # A fixed chance of a preconditioner update per step; None: the schedule below.
    preconditioner_update_probability: float | None = None
    update_probability_flat_start: int = 500
    update_probability_decay: float = 0.001
    min_update_probability: float = 0.03
    precondition_lr: float = 0.1
    precondition_init_scale: float = 1.0
    max_size_triangular: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, "beta1", lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.9")
        require(
            self, "preconditioner_update_probability", lambda v: 0 < v <= 1, "a number in (0, 1], or None for the schedule",
            optional=True,
        )
        require(self, "update_probability_flat_start", lambda v: v >= 0 and float(v).is_integer(), "a whole number of steps >= 0")
        require(self, "update_probability_decay", lambda v: v >= 0, "a finite number >= 0, e.g. 0.001")
        require(self, "min_update_probability", lambda v: 0 < v <= 1, "a number in (0, 1], e.g. 0.03")
        require(self, "precondition_lr", lambda v: v > 0, "a finite number > 0, e.g. 0.1")
        require(self, "precondition_init_scale", lambda v: v > 0, "a finite number > 0, e.g. 1.0")
        require(self, "max_size_triangular", lambda v: v >= 1 and float(v).is_integer(), "a whole number >= 1, e.g. 8192")
        require(self, "seed", lambda v: float(v).is_integer(), "a whole number")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        kron = scale_by_kron(
            lambda tree: matrix_layouts(tree, param_axes),
            b1=self.beta1,
            precondition_lr=self.precondition_lr,
            init_scale=self.precondition_init_scale,
            max_size_triangular=int(self.max_size_triangular),
            probability=dict(
                fixed=self.preconditioner_update_probability,
                flat_start=int(self.update_probability_flat_start),
                decay=self.update_probability_decay,
                min_probability=self.min_update_probability,
            ),
            seed=int(self.seed),
        )
        return optax.chain(self._clipping(), kron, self._decay(weight_decay_mask, param_axes), self._learning_rate(num_train_steps))
