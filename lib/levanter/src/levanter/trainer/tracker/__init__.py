"""Metric trackers: ``metrics.jsonl`` always; TensorBoard and W&B when configured (imported lazily,
with an actionable error when their package is missing). The run's folder may be any URL: each
tracker writes there, or says in a log line where its files go instead."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from levanter.trainer.tracker.base import Tracker, TrackerUnavailableError
from levanter.trainer.tracker.jsonl import JsonlTracker, read_metrics, truncate_metrics
from rigging import filesystem as fsx

TRACKER_NAMES = ("jsonl", "tensorboard", "wandb")


class CompositeTracker:
    """Fans each call out to several trackers."""

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.log(step, metrics)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.log_summary(metrics)

    def flush(self) -> None:
        for t in self.trackers:
            t.flush()

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def build_trackers(
    names: Sequence[str],
    *,
    metrics_path: str,
    log_dir: str,
    run_config: Mapping[str, Any] | None = None,
    wandb_project: str | None = None,
    wandb_run_name: str | None = None,
    resume_step: int | None = None,
) -> CompositeTracker:
    """``resume_step``: the checkpoint step a resumed run starts from (None: a fresh run); the
    metrics file is cut back to it so that no step appears twice."""
    unknown = [n for n in names if n not in TRACKER_NAMES]
    if unknown:
        raise ValueError(f"Unknown tracker(s) {unknown}; choose from {', '.join(TRACKER_NAMES)}.")
    trackers: list[Tracker] = [JsonlTracker(metrics_path, resume_step=resume_step)]  # always, whatever else is asked for
    if "tensorboard" in names:
        from levanter.trainer.tracker.tensorboard import TensorBoardTracker

        trackers.append(TensorBoardTracker(fsx.join(log_dir, "tensorboard")))
    if "wandb" in names:
        from levanter.trainer.tracker.wandb import WandbTracker

        trackers.append(
            WandbTracker(project=wandb_project, run_name=wandb_run_name, config=run_config or {}, log_dir=log_dir)
        )
    return CompositeTracker(trackers)


__all__ = [
    "CompositeTracker",
    "JsonlTracker",
    "TRACKER_NAMES",
    "Tracker",
    "TrackerUnavailableError",
    "build_trackers",
    "read_metrics",
    "truncate_metrics",
]
