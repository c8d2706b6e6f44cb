"""Metric trackers: ``metrics.jsonl`` always; TensorBoard and W&B when configured (imported lazily,
with an actionable error when their package is missing). The run's folder may be any URL: each
tracker writes there, or says in a log line where its files go instead.

Which trackers a run uses (:func:`resolve_tracker_names`): those named in ``TrainerConfig.trackers``,
plus ``jsonl``, plus ``wandb`` on the reporting process when W&B is installed and the environment asks
for it (``WANDB_PROJECT`` set, or ``WANDB_MODE`` set to ``online`` or ``offline``). An API key alone does
not turn W&B on: it is a credential often kept in the shell, not a request to track this run."""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, Mapping, Sequence

from levanter.trainer.tracker.base import Tracker, TrackerUnavailableError
from levanter.trainer.tracker.jsonl import JsonlTracker, read_metrics, truncate_metrics
from rigging import filesystem as fsx

TRACKER_NAMES = ("jsonl", "tensorboard", "wandb")

logger = logging.getLogger(__name__)


def wandb_requested_by_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """The variable that asks for W&B (``"WANDB_PROJECT"`` or ``"WANDB_MODE"``), or None."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_PROJECT"):
        return "WANDB_PROJECT"
    if environ.get("WANDB_MODE", "").lower() in ("online", "offline"):
        return "WANDB_MODE"
    return None


def resolve_tracker_names(
    names: Sequence[str], *, environ: Mapping[str, str] | None = None, reporting: bool | None = None
) -> tuple[str, ...]:
    """The trackers a run uses, by the rule in the module docstring. ``reporting``: whether this process
    reports for the run (default: JAX process 0), since only that one may open a W&B run of its own."""
    resolved = ["jsonl", *(n for n in names if n != "jsonl")]
    if "wandb" in resolved:
        return tuple(resolved)
    variable = wandb_requested_by_environment(environ)
    if variable is None:
        return tuple(resolved)
    if reporting is None:
        import jax

        reporting = jax.process_index() == 0
    if not reporting:
        return tuple(resolved)
    if importlib.util.find_spec("wandb") is None:
        logger.warning("%s is set but wandb is not installed; this run does not log to W&B.", variable)
        return tuple(resolved)
    logger.info("Logging to W&B too: %s is set (it is not in TrainerConfig.trackers).", variable)
    return (*resolved, "wandb")


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
    """The trackers of ``resolve_tracker_names(names)``. ``resume_step``: the checkpoint step a resumed
    run starts from (None: a fresh run); the metrics file is cut back to it so that no step appears twice."""
    unknown = [n for n in names if n not in TRACKER_NAMES]
    if unknown:
        raise ValueError(f"Unknown tracker(s) {unknown}; choose from {', '.join(TRACKER_NAMES)}.")
    names = resolve_tracker_names(names)
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
    "resolve_tracker_names",
    "truncate_metrics",
]
