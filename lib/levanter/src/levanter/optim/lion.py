"""Lion (sign momentum): half of Adam's optimizer memory; wants a ~3-10x smaller learning rate and a
correspondingly larger weight decay than AdamW."""

from __future__ import annotations

from dataclasses import dataclass, field

import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.cautious import with_cautious_mask
from levanter.recorded_fields import OMIT_WHEN_DEFAULT


@OptimizerConfig.register("lion")
@dataclass(frozen=True, kw_only=True)
class LionConfig(OptimizerConfig):
    beta1: float = 0.9
    beta2: float = 0.99
    # Cautious Lion (levanter.optim.cautious); omitted from the record while False.
    cautious: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.9")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        scale = optax.scale_by_lion(b1=self.beta1, b2=self.beta2)
        return optax.chain(
            self._clipping(),
            with_cautious_mask(scale, param_axes) if self.cautious else scale,
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),
        )
