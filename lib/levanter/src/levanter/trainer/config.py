"""The trainer's settings: one frozen, JSON-serialisable dataclass (run configs and provenance record it).

Each field says which kind of setting it is: those marked :data:`HASHED` decide what the run
computes (with the same data, model and optimizer, the same values give the same weights); the
others only where it runs, how often it saves or logs, and how it is observed. Callers that identify
a run by what it computes hash :meth:`TrainerConfig.hashed_settings`, so a new setting is classified
once, where it is declared.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from levanter.errors import LevanterError
from levanter.recorded_fields import OMIT_WHEN_DEFAULT, fields_to_record
from levanter.trainer.mixed_precision import COMPUTE_DTYPE_POLICIES
from levanter.trainer.tracker import TRACKER_NAMES


class TrainerConfigError(LevanterError, ValueError):
    """Trainer settings that contradict each other or the hardware."""


class MeshConfigError(TrainerConfigError):
    """A device mesh that does not fit its devices, its batch, or its model's heads or experts."""


# Field metadata of the settings that decide the trained weights (see the module's docstring).
HASHED = {"hashed": True}
# The same, for settings added after runs were identified by these hashes: left out of
# hashed_settings() while they hold their default, so those runs keep their identities.
HASHED_WHEN_SET = {**HASHED, **OMIT_WHEN_DEFAULT}


# The mesh axes that split a batch's rows: experts is a data axis for everything but the experts.
BATCH_AXES = ("data", "fsdp", "experts")


@dataclass(frozen=True)
class MeshConfig:
    """Device-mesh shape. ``data``: replicas holding whole parameters; ``fsdp``: data parallelism
    with parameters and optimizer state sharded; ``model``: tensor parallelism; ``experts``: data
    parallelism whose devices each hold ``num_experts / experts`` of every MoE layer's experts,
    tokens travelling to their experts by all-to-all (dense models treat it as ``data``). One axis
    may be -1 to take the remaining devices. The default, ``data=-1``, is plain data parallelism
    over every local device (one CPU device on a laptop)."""

    data: int = -1
    fsdp: int = 1
    model: int = 1
    experts: int = 1

    def __post_init__(self) -> None:
        sizes = self.sizes()
        bad = [f"{axis}={size!r}" for axis, size in sizes.items()
               if isinstance(size, bool) or not isinstance(size, int) or not (size >= 1 or size == -1)]
        if bad:
            raise MeshConfigError(f"Mesh axis sizes must be positive integers (or -1 for one axis); got {', '.join(bad)}.")
        if list(sizes.values()).count(-1) > 1:
            hint = " (data is -1 unless given: MeshConfig(data=1, ...))" if self.data == -1 else ""
            raise MeshConfigError(f"At most one mesh axis may be -1 (the remaining devices); got {self.describe()}{hint}.")

    def sizes(self) -> dict[str, int]:
        """Each axis's size by name, in the order the mesh lays them out (the outermost first)."""
        return {"data": self.data, "fsdp": self.fsdp, "experts": self.experts, "model": self.model}

    def describe(self) -> str:
        """``data=1 x fsdp=256 x experts=1 x model=1``: the sizes, as messages and records write them."""
        return " x ".join(f"{axis}={size}" for axis, size in self.sizes().items())


@dataclass(frozen=True)
class ProfileConfig:
    """Trace ``num_steps`` training steps with ``jax.profiler``, from step ``start_step`` on (steps
    numbered as in ``metrics.jsonl``: step 1 is the first update and includes compilation). The
    trace goes to ``<run>/profile/`` (see :mod:`levanter.trainer.profiler`)."""

    start_step: int = 5
    num_steps: int = 3

    def __post_init__(self) -> None:
        for name in ("start_step", "num_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrainerConfigError(f"ProfileConfig.{name} must be a positive integer, got {value!r}.")

    @property
    def last_step(self) -> int:
        return self.start_step + self.num_steps - 1


@dataclass(frozen=True)
class TrainerConfig:
    num_train_steps: int = field(metadata=HASHED)
    batch_size: int = field(metadata=HASHED)
    # Rows per forward/backward pass; gradients of the batch's microbatches are summed before the
    # single optimizer update, so the update equals the full-batch one. None = the whole batch.
    # Hashed all the same: the order of the sums, so the last bits of the weights, depend on it.
    microbatch_size: int | None = field(default=None, metadata=HASHED)
    z_loss_weight: float = field(default=0.0, metadata=HASHED)
    # "auto": bf16 compute on GPU/TPU, f32 on CPU. Parameters and optimizer state are always f32.
    compute_dtype: str = field(default="auto", metadata=HASHED)
    seed: int = field(default=0, metadata=HASHED)
    # Skip a step whose loss or gradient norm is not finite, or (with skip_loss_spike_factor) whose
    # loss exceeds that factor times the mean of the last skip_loss_window finite losses: the
    # parameters and optimizer state stay as they were, the step and the data move on
    # (levanter.trainer.bad_steps). Off: a non-finite loss stops the run.
    skip_bad_steps: bool = field(default=False, metadata=HASHED_WHEN_SET)
    skip_loss_spike_factor: float | None = field(default=None, metadata=HASHED_WHEN_SET)
    skip_loss_window: int = field(default=32, metadata=HASHED_WHEN_SET)
    # Keep an exponential moving average of the weights, ema <- d * ema + (1 - d) * weights after
    # each step, from the initial weights; evaluations report it beside the weights, and it is the
    # model a run returns and exports. None: no average.
    ema_decay: float | None = field(default=None, metadata=HASHED_WHEN_SET)
    # Evaluate every N steps (and after the last step); None = only after the last step.
    eval_every: int | None = None
    steps_per_checkpoint: int | None = None
    minutes_per_checkpoint: float | None = None
    # Keep the newest K checkpoints (None = keep all); also keep every step divisible by keep_every.
    keep_last_checkpoints: int | None = 2
    keep_every: int | None = None
    checkpoint_at_end: bool = True
    # Resume from a checkpoint without its checksums.json (written before checkpoints carried one),
    # saying so in the log and the run's summary; by default such a checkpoint is set aside as damaged.
    allow_unverified_checkpoints: bool = False
    # Progress lines and TensorBoard/W&B writes every N steps; metrics.jsonl gets every step.
    log_every: int = 10
    mesh: MeshConfig = field(default_factory=MeshConfig)
    # Keep the optimizer's state (AdamW's two moments: twice the parameters in float32) in the host's
    # memory instead of the accelerator's, moving it in for each update and back out: a model whose
    # parameters, gradients and moments do not fit the chip's memory together can still train there,
    # at the cost of that traffic each step. Placement only: the same numbers are computed.
    offload_optimizer_state: bool = False
    trackers: tuple[str, ...] = ("jsonl",)
    wandb_project: str | None = None
    wandb_run_name: str | None = None
    # Where and how the run is observed, not what it computes: never part of a step's identity.
    profile: ProfileConfig | None = None

    def __post_init__(self) -> None:
        if self.num_train_steps <= 0:
            raise TrainerConfigError(f"num_train_steps must be positive, got {self.num_train_steps}.")
        if self.batch_size <= 0:
            raise TrainerConfigError(f"batch_size must be positive, got {self.batch_size}.")
        mb = self.microbatch_size
        if mb is not None and (mb <= 0 or self.batch_size % mb):
            raise TrainerConfigError(
                f"microbatch_size={mb} must be a positive divisor of batch_size={self.batch_size}."
            )
        if self.compute_dtype not in COMPUTE_DTYPE_POLICIES:
            raise TrainerConfigError(
                f"compute_dtype={self.compute_dtype!r}; choose one of {', '.join(COMPUTE_DTYPE_POLICIES)}."
            )
        bad = [t for t in self.trackers if t not in TRACKER_NAMES]
        if bad:
            raise TrainerConfigError(f"Unknown tracker(s) {bad}; choose from {', '.join(TRACKER_NAMES)}.")
        for name in ("eval_every", "steps_per_checkpoint", "log_every", "keep_every", "keep_last_checkpoints"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise TrainerConfigError(f"{name} must be positive or None, got {value}.")
        if self.skip_loss_spike_factor is not None:
            if not self.skip_bad_steps:
                raise TrainerConfigError("skip_loss_spike_factor is set but skip_bad_steps is off; set skip_bad_steps=True.")
            if not (math.isfinite(self.skip_loss_spike_factor) and self.skip_loss_spike_factor > 1):
                raise TrainerConfigError(
                    f"skip_loss_spike_factor must be a number > 1 (e.g. 2.0: skip a loss twice the recent mean), "
                    f"got {self.skip_loss_spike_factor!r}."
                )
        if isinstance(self.skip_loss_window, bool) or not isinstance(self.skip_loss_window, int) or self.skip_loss_window < 1:
            raise TrainerConfigError(f"skip_loss_window must be a positive integer, got {self.skip_loss_window!r}.")
        if self.ema_decay is not None and not (isinstance(self.ema_decay, int | float) and 0 < self.ema_decay < 1):
            raise TrainerConfigError(f"ema_decay must be a number in (0, 1), e.g. 0.999, or None; got {self.ema_decay!r}.")
        # Tuples survive JSON as lists; normalise so a config read back compares equal.
        object.__setattr__(self, "trackers", tuple(self.trackers))

    @property
    def num_microbatches(self) -> int:
        return 1 if self.microbatch_size is None else self.batch_size // self.microbatch_size

    def hashed_settings(self) -> dict[str, Any]:
        """The settings marked :data:`HASHED`, by name, as given: what a run's identity covers."""
        return {f.name: getattr(self, f.name) for f in fields_to_record(self) if f.metadata.get("hashed")}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "TrainerConfig":
        record = dict(record)
        if isinstance(record.get("mesh"), dict):
            record["mesh"] = MeshConfig(**record["mesh"])
        if isinstance(record.get("profile"), dict):
            record["profile"] = ProfileConfig(**record["profile"])
        return cls(**record)
