"""Muon: Nesterov momentum orthogonalised by Newton-Schulz on hidden matrices, AdamW on the rest.

Each hidden matrix (role ``matrix``, see :mod:`levanter.optim.matrix_layout`; stacked layers and
experts are separate matrices) steps along ``NS(g + momentum * buf)`` where
``buf <- momentum * buf + g``: a direction with all singular values near 1, scaled by a factor of
its shape (``update_scale``). Embeddings, the output head and vectors (norm scales, biases) are
trained with AdamW at ``adam_learning_rate``, following the same schedule shape.

``update_scale`` (two definitions are in common use; torch.optim.Muon offers both as ``adjust_lr_fn``):

- ``"fan_ratio"``: ``sqrt(max(1, fan_out / fan_in))``, Keller Jordan's original (torch's default,
  ``"original"``). Typical learning rates are around 0.02, far above AdamW's, so set
  ``adam_learning_rate`` too.
- ``"adamw_rms"``: ``0.2 * sqrt(max(fan_in, fan_out))``, Moonshot's ("Muon is Scalable for LLM
  Training", torch's ``"match_rms_adamw"``): the update then has AdamW's typical RMS, so AdamW's
  learning rate and weight decay carry over and one rate serves both groups.

Weight decay is decoupled, ``param * (1 - lr * weight_decay)`` with the *unscaled* rate as in
torch.optim.Muon (AdamW's group: its own rate), on the matrices the decay mask selects.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.errors import OptimizerConfigError
from levanter.optim.matrix_layout import MatrixLayout, matrix_layouts
from levanter.optim.newton_schulz import KELLER_JORDAN_COEFFICIENTS, orthogonalize

UPDATE_SCALES = ("fan_ratio", "adamw_rms")


def update_scale_factor(rule: str, fan_in: int, fan_out: int) -> float:
    """The multiplier of an orthogonalised update of a ``fan_in x fan_out`` matrix under ``rule``."""
    if rule == "fan_ratio":
        return max(1.0, fan_out / fan_in) ** 0.5
    if rule == "adamw_rms":
        return 0.2 * max(fan_in, fan_out) ** 0.5
    raise OptimizerConfigError(f"update_scale must be one of {', '.join(UPDATE_SCALES)}; got {rule!r}.")


def scale_by_orthogonalization(
    layouts, *, steps: int, coefficients: tuple[float, float, float], update_scale: str | None, eps: float = 1e-7
) -> optax.GradientTransformation:
    """Replace each matrix-shaped update by its Newton-Schulz orthogonalisation, one per stacked
    copy, times ``update_scale_factor`` (no factor when ``update_scale`` is None). ``layouts``:
    params -> tree of :class:`MatrixLayout` (masked-out slots kept)."""

    def one(u, layout):
        if not isinstance(layout, MatrixLayout):
            return u
        scale = 1.0 if update_scale is None else update_scale_factor(update_scale, layout.fan_in_size, layout.fan_out_size)
        o = orthogonalize(layout.to_matrix(u), steps=steps, coefficients=coefficients, eps=eps)
        return layout.from_matrix(o * jnp.asarray(scale, o.dtype))

    def update(updates, state, params=None):
        del params
        return jax.tree.map(one, updates, layouts(updates), is_leaf=_is_masked), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _is_masked(x) -> bool:
    return isinstance(x, optax.MaskedNode)


@OptimizerConfig.register("muon")
@dataclass(frozen=True, kw_only=True)
class MuonConfig(OptimizerConfig):
    """Muon on hidden matrices, AdamW on embeddings, head and vectors (see the module docstring)."""

    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = KELLER_JORDAN_COEFFICIENTS
    update_scale: str = "fan_ratio"
    # AdamW for everything that is not a hidden matrix; None: the same peak rate as the matrices.
    adam_learning_rate: float | None = None
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_epsilon: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, "momentum", lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.95")
        require(self, "ns_steps", lambda v: v >= 1 and float(v).is_integer(), "a whole number >= 1, e.g. 5")
        if self.update_scale not in UPDATE_SCALES:
            raise OptimizerConfigError(
                f"MuonConfig.update_scale must be one of {', '.join(UPDATE_SCALES)}; got {self.update_scale!r}."
            )
        # A tuple whatever was given: JSON and YAML give lists, and equal configs must compare equal.
        object.__setattr__(self, "ns_coefficients", tuple(float(c) for c in self.ns_coefficients))
        if len(self.ns_coefficients) != 3:
            raise OptimizerConfigError(f"MuonConfig.ns_coefficients must be three numbers (a, b, c); got {self.ns_coefficients!r}.")
        require(self, "adam_learning_rate", lambda v: v > 0, "a finite number > 0, or None for learning_rate", optional=True)
        for beta in ("adam_beta1", "adam_beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.9")
        require(self, "adam_epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-8")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        layouts = lambda tree: matrix_layouts(tree, param_axes)  # noqa: E731
        is_hidden = lambda tree: jax.tree.map(lambda l: l.role == "matrix", layouts(tree))  # noqa: E731
        labels = lambda tree: jax.tree.map(lambda hidden: "muon" if hidden else "adam", is_hidden(tree))  # noqa: E731
        adam_ratio = (self.adam_learning_rate or self.learning_rate) / self.learning_rate
        muon = optax.chain(
            optax.trace(decay=self.momentum, nesterov=self.nesterov),
            scale_by_orthogonalization(
                layouts, steps=int(self.ns_steps), coefficients=tuple(self.ns_coefficients), update_scale=self.update_scale
            ),
        )
        adam = optax.scale_by_adam(b1=self.adam_beta1, b2=self.adam_beta2, eps=self.adam_epsilon)
        return optax.chain(
            self._clipping(),
            optax.partition({"muon": muon, "adam": adam}, labels),
            self._decay(weight_decay_mask, param_axes),
            # AdamW's group runs at its own rate: its update and its decay, as in AdamW.
            optax.masked(optax.scale(adam_ratio), lambda tree: jax.tree.map(lambda h: not h, is_hidden(tree))),
            self._learning_rate(num_train_steps),
        )
