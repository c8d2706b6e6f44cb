"""AdamW with global-norm clipping, decoupled weight decay and a learning-rate schedule; optionally
Nesterov momentum (NAdamW) and clipping of the Adam update itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import optax

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.cautious import with_cautious_mask
from levanter.optim.errors import OptimizerConfigError
from levanter.optim.narrow_state import stored_in_bfloat16
from levanter.optim.update_clipping import clip_update_rms
from levanter.recorded_fields import OMIT_WHEN_DEFAULT


# What AdamConfig.moment_dtype may be.
MOMENT_DTYPES = ("float32", "bfloat16")


@OptimizerConfig.register("adam")
@dataclass(frozen=True, kw_only=True)
class AdamConfig(OptimizerConfig):
    """AdamW. Update order: clip the gradient, Adam moments, add ``weight_decay * param`` (masked:
    see ``weight_decay_exclude``), scale by ``-lr(step)``. With ``cautious=True`` the Adam step is
    masked by the gradient's sign before the weight decay; ``update_rms_clip`` and
    ``update_norm_clip`` then bound it, still before the weight decay and the learning rate."""

    beta1: float = 0.9
    beta2: float = 0.95
    epsilon: float = 1e-8
    # Cautious AdamW (levanter.optim.cautious): drop the update's components whose sign disagrees
    # with the gradient's. Omitted from the record while False, so existing runs keep their hashes.
    cautious: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)
    # NAdamW (Dozat 2016): the step uses the bias-corrected momentum of the *next* step,
    # b1 * m_t / (1 - b1^(t+1)) + (1 - b1) * g_t / (1 - b1^t), as optax.scale_by_adam(nesterov=True).
    nesterov: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)
    # Update clipping (Adafactor's, Shazeer & Stern 2018): scale each parameter's Adam step down to
    # an RMS of at most this (one stacked layer counting as one parameter); None: off. Bounds the
    # first steps after a rare large gradient, where the second moment lags behind.
    update_rms_clip: float | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)
    # Scale the whole Adam step (every parameter together) down to a global L2 norm of at most this.
    update_norm_clip: float | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)
    # What the two moments are stored in between steps: "float32", or "bfloat16" for half the bytes
    # (the update still computes in float32; stored rounded stochastically: levanter.optim.narrow_state).
    moment_dtype: str = field(default="float32", metadata=OMIT_WHEN_DEFAULT)

    def __post_init__(self) -> None:
        super().__post_init__()
        for beta in ("beta1", "beta2"):
            require(self, beta, lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.9")
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-8 (with 0, a zero gradient gives 0/0)")
        for bound in ("update_rms_clip", "update_norm_clip"):
            require(self, bound, lambda v: v > 0, "a finite number > 0, e.g. 1.0, or None for no clipping", optional=True)
        if self.moment_dtype not in MOMENT_DTYPES:
            raise OptimizerConfigError(
                f"AdamConfig.moment_dtype must be one of {', '.join(MOMENT_DTYPES)}; got {self.moment_dtype!r}."
            )

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        scale = optax.scale_by_adam(b1=self.beta1, b2=self.beta2, eps=self.epsilon, nesterov=self.nesterov)
        if self.moment_dtype == "bfloat16":
            scale = stored_in_bfloat16(scale)
        return optax.chain(
            self._clipping(),
            with_cautious_mask(scale, param_axes) if self.cautious else scale,
            *([clip_update_rms(self.update_rms_clip, param_axes)] if self.update_rms_clip is not None else []),
            *([optax.clip_by_global_norm(self.update_norm_clip)] if self.update_norm_clip is not None else []),
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),
        )
