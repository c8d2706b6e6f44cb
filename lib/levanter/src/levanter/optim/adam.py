"""AdamW with global-norm clipping, decoupled weight decay and a learning-rate schedule."""

from __future__ import annotations

from dataclasses import dataclass, field

import optax

from levanter.models.transformer import OMIT_WHEN_DEFAULT
from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.cautious import with_cautious_mask


@OptimizerConfig.register("adam")
@dataclass(frozen=True, kw_only=True)
class AdamConfig(OptimizerConfig):
    """AdamW. Update order: clip the gradient, Adam moments, add ``weight_decay * param`` (masked:
    vectors such as norm scales and biases are not decayed), scale by ``-lr(step)``. With
    ``cautious=True`` the Adam step is masked by the gradient's sign before the weight decay."""

    beta1: float = 0.9
    beta2: float = 0.95
    epsilon: float = 1e-8
    # Cautious AdamW (levanter.optim.cautious): drop the update's components whose sign disagrees
    # with the gradient's. Omitted from the record while False, so existing runs keep their hashes.
    cautious: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.9")
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-8 (with 0, a zero gradient gives 0/0)")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        scale = optax.scale_by_adam(b1=self.beta1, b2=self.beta2, eps=self.epsilon)
        return optax.chain(
            self._clipping(),
            with_cautious_mask(scale, param_axes) if self.cautious else scale,
            self._decay(weight_decay_mask),
            self._learning_rate(num_train_steps),
        )
