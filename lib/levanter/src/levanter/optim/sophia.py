"""Sophia-H (Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language
Model Pre-training"): momentum divided by an estimate of the Hessian's diagonal, clipped per entry.

Every ``update_interval`` steps the diagonal is estimated with Hutchinson's estimator,
``z * (H z)`` for a random sign vector ``z`` (drawn as optax's ``hutchinson_estimator_diag_hessian``
draws it), one Hessian-vector product of this step's loss, and averaged into ``h`` with ``beta2``.
The product is taken reverse-over-reverse (the gradient of ``<grad f, z>``), not forward-over-reverse
as optax does: the trainer's loss has a custom VJP (the fused, blockwise cross-entropy), which
forward-mode differentiation cannot go through. The step is
``clip(m / max(gamma * h, epsilon), -1, 1)``: where the curvature is small or negative the step is
a sign step of size ``lr``. The loss comes from the trainer as ``obj_fn`` (see
``OptimizerConfig.needs_objective``); on microbatched steps it is the first microbatch's, scaled to
the whole batch. Sophia-G (the Gauss-Newton-Bartlett estimate from labels sampled from the model)
is not implemented: it needs the model's logits, which the optimizer's interface does not carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.errors import OptimizerConfigError


class ScaleBySophiaState(NamedTuple):
    count: jax.Array
    mu: Any
    hessian: Any  # the moving average of the diagonal estimates
    estimator: Any  # the estimator's own state (its random key)


class HutchinsonState(NamedTuple):
    key: jax.Array


def hutchinson_diagonal(key: jax.Array) -> optax.GradientTransformationExtraArgs:
    """Hutchinson's estimate of the Hessian's diagonal, ``z * (H z)``, with the sign vectors optax's
    ``hutchinson_estimator_diag_hessian`` draws from the same key, and ``H z`` as the gradient of
    ``<grad obj_fn, z>`` (reverse over reverse), which also differentiates functions with a custom VJP."""

    def init(params):
        del params
        return HutchinsonState(key=key)

    def update(updates, state, params=None, *, obj_fn=None, **extra_args):
        del updates, extra_args
        key, subkey = jax.random.split(state.key)
        signs = optax.tree.random_like(subkey, params, jax.random.rademacher, dtype=jnp.float32)
        signs = optax.tree.cast(signs, optax.tree.dtype(params, "lowest"))
        hvp = jax.grad(lambda p: optax.tree.vdot(jax.grad(obj_fn)(p), signs))(params)
        return jax.tree.map(lambda h, z: h * z, hvp, signs), HutchinsonState(key=key)

    return optax.GradientTransformationExtraArgs(init, update)


def scale_by_sophia(
    *, b1: float, b2: float, gamma: float, eps: float, update_interval: int, seed: int = 0
) -> optax.GradientTransformationExtraArgs:
    """The paper's Algorithm 3: the estimate of step ``t`` (taken when ``(t - 1) % update_interval
    == 0``) is used by step ``t`` itself, and the momentum is not bias-corrected."""
    estimator = hutchinson_diagonal(jax.random.PRNGKey(seed))

    def init(params):
        return ScaleBySophiaState(
            count=jnp.zeros([], jnp.int32),
            mu=optax.tree.zeros_like(params),
            hessian=optax.tree.zeros_like(params),
            estimator=estimator.init(params),
        )

    def update(grads, state, params=None, *, obj_fn=None, **extra_args):
        if params is None or obj_fn is None:
            raise OptimizerConfigError(
                "SophiaConfig: update needs params= and obj_fn= (parameters -> this batch's loss) for its Hessian "
                "estimate; the trainer passes them because SophiaConfig.needs_objective is True."
            )

        def refresh(hessian, estimator_state):
            estimate, estimator_state = estimator.update(grads, estimator_state, params, obj_fn=obj_fn)
            return optax.tree.update_moment(estimate, hessian, b2, 1), estimator_state

        hessian, estimator_state = jax.lax.cond(
            state.count % update_interval == 0, refresh, lambda h, e: (h, e), state.hessian, state.estimator
        )
        mu = optax.tree.update_moment(grads, state.mu, b1, 1)
        updates = jax.tree.map(lambda m, h: jnp.clip(m / jnp.maximum(gamma * h, eps), -1.0, 1.0), mu, hessian)
        count = optax.safe_increment(state.count)
        return updates, ScaleBySophiaState(count=count, mu=mu, hessian=hessian, estimator=estimator_state)

    return optax.GradientTransformationExtraArgs(init, update)


@OptimizerConfig.register("sophia")
@dataclass(frozen=True, kw_only=True)
class SophiaConfig(OptimizerConfig):
    """Sophia-H. The update's entries are at most 1 in size, so ``learning_rate`` is the largest
    step any parameter takes; ``gamma`` trades the Newton-like step against that sign-step bound."""

    beta1: float = 0.965
    beta2: float = 0.99
    gamma: float = 0.01
    epsilon: float = 1e-12
    update_interval: int = 10
    seed: int = 0  # the estimator's random sign vectors

    needs_objective = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.965")
        require(self, "gamma", lambda v: v > 0, "a finite number > 0, e.g. 0.01")
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-12")
        if not _whole(self.update_interval) or self.update_interval < 1:
            raise OptimizerConfigError(
                f"SophiaConfig.update_interval must be a whole number >= 1, e.g. 10; got {self.update_interval!r}."
            )
        if not _whole(self.seed):
            raise OptimizerConfigError(f"SophiaConfig.seed must be a whole number; got {self.seed!r}.")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        return optax.chain(
            self._clipping(),
            scale_by_sophia(
                b1=self.beta1, b2=self.beta2, gamma=self.gamma, eps=self.epsilon,
                update_interval=self.update_interval, seed=self.seed,
            ),
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),
        )


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
