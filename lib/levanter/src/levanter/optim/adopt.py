"""ADOPT (Taniguchi et al. 2024): Adam whose step normalises the gradient by the second moment of
the *previous* steps, which lets it converge with any ``beta2``; optax's ``scale_by_adopt``."""

from __future__ import annotations

from dataclasses import dataclass

import optax
import optax.contrib

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require


@OptimizerConfig.register("adopt")
@dataclass(frozen=True, kw_only=True)
class AdoptConfig(OptimizerConfig):
    """The first step only records the squared gradient and leaves the parameters unchanged (but
    for weight decay); from then on the normalised gradient ``g / max(sqrt(v_prev), epsilon)`` is
    clipped to ``+-step**0.25`` (``clipping``, the authors' default: it tames the first steps) and
    averaged into the momentum, which is the step. Same state as AdamW (two moments)."""

    beta1: float = 0.9
    beta2: float = 0.9999
    epsilon: float = 1e-6
    clipping: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.9")
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-6 (with 0, a zero gradient gives 0/0)")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        return optax.chain(
            self._clipping(),
            optax.contrib.scale_by_adopt(
                b1=self.beta1,
                b2=self.beta2,
                eps=self.epsilon,
                use_clipping=self.clipping,
                # optax counts the steps before this one; the authors clip at the 1-based step
                # number (2**0.25 on the first step that moves the parameters): their bound.
                clip_value_fn=lambda count: (count + 1) ** 0.25,
            ),
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),
        )
