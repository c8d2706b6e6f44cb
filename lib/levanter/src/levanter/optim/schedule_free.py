"""Schedule-free AdamW (Defazio et al. 2024, "The Road Less Scheduled"): no decaying learning rate;
the parameters to use are an average of the iterates, kept implicitly.

Training keeps ``z`` (plain Adam-normalised steps, no momentum) in the optimizer state and the
parameters at ``y = (1 - beta1) z + beta1 x``, where ``x`` is the running average of the ``z``s
weighted by ``lr**weight_lr_power``. The gradient is taken at ``y`` (the trainer's parameters);
``x`` is what should be evaluated and exported, and :meth:`ScheduleFreeAdamConfig.evaluation_params`
computes it (``optax.contrib.schedule_free_eval_params``): the trainer's evaluations, its returned
model and the Hugging Face export use it. Checkpoints hold ``y`` and ``z``, so a run resumes
exactly; whoever takes only ``params`` from such a checkpoint (``initialize_from``) gets ``y``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import optax
import optax.contrib

from levanter.optim.base import DecayMask, OptimizerConfig, ParamAxes, require
from levanter.optim.errors import ScheduleError


@OptimizerConfig.register("schedule_free_adam")
@dataclass(frozen=True, kw_only=True)
class ScheduleFreeAdamConfig(OptimizerConfig):
    """Weight decay is taken at ``y`` (as in the authors' ``AdamWScheduleFree``). ``warmup`` still
    applies; the schedule after it must be ``constant``. State: ``z`` and Adam's second moment,
    the same size as AdamW's two moments."""

    lr_schedule: str = "constant"
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_lr_power: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_schedule != "constant":
            raise ScheduleError(
                f"ScheduleFreeAdamConfig.lr_schedule must be 'constant' (the averaging replaces the decay; warmup= "
                f"still applies); got {self.lr_schedule!r}."
            )
        require(self, "beta1", lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.9 (the evaluated point divides by it)")
        require(self, "beta2", lambda v: 0 <= v < 1, "a number in [0, 1), e.g. 0.999")
        require(self, "epsilon", lambda v: v > 0, "a finite number > 0, e.g. 1e-8 (with 0, a zero gradient gives 0/0)")
        require(self, "weight_lr_power", lambda v: v >= 0, "a finite number >= 0, e.g. 2.0")

    def build(
        self, num_train_steps: int, *, weight_decay_mask: DecayMask | None = None, param_axes: ParamAxes | None = None
    ) -> optax.GradientTransformation:
        schedule = self.lr_scheduler(num_train_steps)
        z_step = optax.chain(
            # Adam without momentum, without storing a first moment.
            optax.scale_by_rms(decay=self.beta2, eps=self.epsilon, eps_in_sqrt=False, bias_correction=True),
            self._decay(weight_decay_mask, param_axes),
            self._learning_rate(num_train_steps),  # takes the trainer's learning_rate= of the step
        )
        return optax.chain(
            self._clipping(),
            optax.contrib.schedule_free(
                z_step,
                # optax asks for the rate at its 1-based step count; the schedule is 0-based, as
                # the rate the trainer passes for the same step (and the authors' warm-up).
                learning_rate=lambda count: schedule(count - 1),
                b1=self.beta1,
                weight_lr_power=self.weight_lr_power,
            ),
        )

    def evaluation_params(self, params: Any, opt_state: Any) -> Any:
        state = _schedule_free_state(opt_state)
        return optax.contrib.schedule_free_eval_params(state, params)


def _schedule_free_state(opt_state: Any) -> optax.contrib.ScheduleFreeState:
    found = [
        s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.contrib.ScheduleFreeState))
        if isinstance(s, optax.contrib.ScheduleFreeState)
    ]
    if len(found) != 1:
        raise ValueError(f"schedule_free: expected one ScheduleFreeState in the optimizer state, found {len(found)}.")
    return found[0]
