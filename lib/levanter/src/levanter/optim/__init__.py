"""Optimizers as frozen, JSON-serialisable configs that build optax transformations.

``AdamConfig(learning_rate=6e-4, weight_decay=0.1).build(num_train_steps)`` gives the optax
transformation; ``config.lr_scheduler(num_train_steps)`` the rate per step. New optimizers subclass
:class:`OptimizerConfig` and register themselves (see ``levanter.optim.base``).
"""

from levanter.optim.adam import AdamConfig
from levanter.optim.adam_mini import AdamMiniConfig
from levanter.optim.adopt import AdoptConfig
from levanter.optim.base import OptimizerConfig, default_weight_decay_mask, weight_decay_mask_from_axes
from levanter.optim.errors import OptimizerConfigError, ScheduleError
from levanter.optim.kron import KronConfig
from levanter.optim.lion import LionConfig
from levanter.optim.mars import MarsConfig
from levanter.optim.matrix_layout import MatrixLayout, matrix_layouts
from levanter.optim.muon import MuonConfig
from levanter.optim.schedule import build_lr_schedule
from levanter.optim.schedule_free import ScheduleFreeAdamConfig
from levanter.optim.scion import ScionConfig
from levanter.optim.soap import SOAPConfig
from levanter.optim.sophia import SophiaConfig

__all__ = [
    "AdamConfig",
    "AdamMiniConfig",
    "AdoptConfig",
    "KronConfig",
    "LionConfig",
    "MarsConfig",
    "MatrixLayout",
    "MuonConfig",
    "OptimizerConfig",
    "OptimizerConfigError",
    "ScheduleError",
    "SOAPConfig",
    "ScheduleFreeAdamConfig",
    "ScionConfig",
    "SophiaConfig",
    "build_lr_schedule",
    "default_weight_decay_mask",
    "matrix_layouts",
    "weight_decay_mask_from_axes",
]
