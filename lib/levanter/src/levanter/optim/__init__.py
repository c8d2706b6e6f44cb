"""Optimizers as frozen, JSON-serialisable configs that build optax transformations.

``AdamConfig(learning_rate=6e-4, weight_decay=0.1).build(num_train_steps)`` gives the optax
transformation; ``config.lr_scheduler(num_train_steps)`` the rate per step. New optimizers subclass
:class:`OptimizerConfig` and register themselves (see ``levanter.optim.base``).
"""

from levanter.optim.adam import AdamConfig
from levanter.optim.base import OptimizerConfig, default_weight_decay_mask, weight_decay_mask_from_axes
from levanter.optim.errors import OptimizerConfigError, ScheduleError
from levanter.optim.lion import LionConfig
from levanter.optim.schedule import build_lr_schedule

__all__ = [
    "AdamConfig",
    "LionConfig",
    "OptimizerConfig",
    "OptimizerConfigError",
    "ScheduleError",
    "build_lr_schedule",
    "default_weight_decay_mask",
    "weight_decay_mask_from_axes",
]
