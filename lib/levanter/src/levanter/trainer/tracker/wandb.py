"""Weights & Biases, imported only when asked for."""

from __future__ import annotations

from typing import Any, Mapping

from levanter.trainer.tracker.base import TrackerUnavailableError


class WandbTracker:
    def __init__(self, *, project: str | None, run_name: str | None, config: Mapping[str, Any], log_dir: str):
        try:
            import wandb
        except ImportError as e:
            raise TrackerUnavailableError(
                "The 'wandb' tracker needs the wandb package: `pip install wandb` and `wandb login` (or set "
                "WANDB_MODE=offline); or drop 'wandb' from TrainerConfig.trackers."
            ) from e
        self._wandb = wandb
        self._run = wandb.init(project=project, name=run_name, config=dict(config), dir=log_dir, resume="allow")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        for k, v in metrics.items():
            self._run.summary[k] = v

    def close(self) -> None:
        self._run.finish()
