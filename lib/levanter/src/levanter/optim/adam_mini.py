"""Adam-mini (Zhang et al. 2024, "Adam-mini: Use Fewer Learning Rates To Gain More"): Adam with one
second-moment value per block of a parameter instead of one per entry.

The blocks follow the authors' ``adam-mini`` package (1.1.1), read from the logical axis names
(:mod:`levanter.optim.matrix_layout`) and, for two cases, the parameter's name:

- query and key projections (``q_proj``, ``k_proj``): one block per attention head;
- the embedding and the output head: one block per token (vocabulary entry);
- every other matrix (values, attention output, MLP, router): one block per output neuron;
- norm scales and other vectors: one block for the whole vector;
- biases (a name containing ``bias``): no blocks, one value per entry as in Adam.

Stacked copies (``layers``, ``experts``) are blocked separately, as the authors' per-layer tensors
are. Without axis names, 2-D arrays are ``[in, out]`` matrices (one block per column) and the rest
vectors. The second moment is stored reduced (its blocked dimensions kept with size 1), so the
optimizer state is about half of AdamW's; the trainer replicates it rather than sharding it like
its parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from haliax.axes import Axes
from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.matrix_layout import layout_of

_PER_HEAD_MODULES = frozenset({"q_proj", "k_proj"})
_HEAD_AXES = frozenset({"heads", "kv_heads"})


class ScaleByAdamMiniState(NamedTuple):
    count: jax.Array
    mu: Any
    nu: Any  # per block: the parameter's shape with each averaged dimension of size 1


def _key_names(path) -> list[str]:
    return [str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path]


def averaged_dims(path, shape: tuple[int, ...], names: Any = None) -> tuple[int, ...]:
    """The dimensions a parameter's second moment is averaged over (its blocks span them)."""
    keys = _key_names(path)
    layout = layout_of(shape, names)
    every = tuple(d for d in range(len(shape)) if d not in layout.stack)
    if any("bias" in k for k in keys):
        return ()
    if layout.role == "vector":
        return every
    if layout.role == "embedding":
        return tuple(d for d in every if d not in layout.fan_in)
    if names is not None and _PER_HEAD_MODULES.intersection(keys):
        heads = [d for d in layout.fan_out if names[d] in _HEAD_AXES]
        if heads:
            return tuple(d for d in every if d not in heads)
    return tuple(d for d in every if d not in layout.fan_out)


def _names_by_path(param_axes: ParamAxes | None) -> dict:
    if param_axes is None:
        return {}
    flat, _ = jax.tree_util.tree_flatten_with_path(param_axes, is_leaf=lambda x: isinstance(x, Axes))
    return {tuple(path): tuple(axes) for path, axes in flat}


def scale_by_adam_mini(*, b1: float, b2: float, eps: float, param_axes: ParamAxes | None = None) -> optax.GradientTransformation:
    names = _names_by_path(param_axes)

    def dims_of(path, x):
        return averaged_dims(path, x.shape, names.get(tuple(path)))

    def init(params):
        def reduced(path, p):
            dims = dims_of(path, p)
            return jnp.zeros(tuple(1 if d in dims else n for d, n in enumerate(p.shape)), p.dtype)

        # A tree map over the parameters (by path, not zipped with the axes) so that optax's
        # tree_map_params, which calls init on a placeholder, still finds the state's trees.
        return ScaleByAdamMiniState(
            count=jnp.zeros([], jnp.int32),
            mu=optax.tree.zeros_like(params),
            nu=jax.tree_util.tree_map_with_path(reduced, params),
        )

    def update(grads, state, params=None):
        count = optax.safe_increment(state.count)
        mu = optax.tree.update_moment(grads, state.mu, b1, 1)
        nu = jax.tree_util.tree_map_with_path(
            lambda path, g, v: b2 * v + (1 - b2) * jnp.mean(jnp.square(g), axis=dims_of(path, g), keepdims=True),
            grads, state.nu,
        )
        mu_hat = optax.tree.bias_correction(mu, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, count)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu_hat, nu_hat)
        return updates, ScaleByAdamMiniState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


@OptimizerConfig.register("adam_mini")
@dataclass(frozen=True, kw_only=True)
class AdamMiniConfig(OptimizerConfig):
    """AdamW with Adam-mini's per-block second moment; same update order as :class:`AdamConfig`."""

    beta1: float = 0.9
    beta2: float = 0.95
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.9")
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-8 (with 0, a zero gradient gives 0/0)")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        return optax.chain(
            self._clipping(),
            scale_by_adam_mini(b1=self.beta1, b2=self.beta2, eps=self.epsilon, param_axes=param_axes),
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),
        )
