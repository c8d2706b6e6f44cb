"""The trainer: jitted steps with gradient accumulation and mixed precision, metrics, evaluation,
and checkpoints that resume to the same trajectory."""

from levanter.trainer.checkpoint import CheckpointError, Checkpointer
from levanter.trainer.config import MeshConfig, MeshConfigError, ProfileConfig, TrainerConfig, TrainerConfigError
from levanter.trainer.data_feed import DataSourceError
from levanter.trainer.evaluation import EvalSources
from levanter.trainer.hardware import model_flops_utilization, peak_flops_per_device
from levanter.trainer.mixed_precision import cast_floating, resolve_compute_dtype
from levanter.trainer.state import TrainState
from levanter.trainer.step_metrics import NonFiniteLossError
from levanter.trainer.stopping import (
    StopAction,
    StopRequest,
    StopSignal,
    StopSource,
    TrainingAbandoned,
    TrainingPreempted,
)
from levanter.trainer.trainer import DataSource, Trainer, TrainResult

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "DataSource",
    "DataSourceError",
    "EvalSources",
    "MeshConfig",
    "MeshConfigError",
    "NonFiniteLossError",
    "ProfileConfig",
    "StopAction",
    "StopRequest",
    "StopSignal",
    "StopSource",
    "TrainResult",
    "TrainState",
    "Trainer",
    "TrainingAbandoned",
    "TrainingPreempted",
    "TrainerConfig",
    "TrainerConfigError",
    "cast_floating",
    "model_flops_utilization",
    "peak_flops_per_device",
    "resolve_compute_dtype",
]
