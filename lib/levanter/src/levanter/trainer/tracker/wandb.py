"""Weights & Biases, imported only when asked for.

W&B keeps its run files in a local folder before syncing them to its server; for a run whose folder
is a URL that is a local temporary folder, named in a log line.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any, Mapping

from levanter.trainer.tracker.base import TrackerUnavailableError
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)


class WandbTracker:
    def __init__(self, *, project: str | None, run_name: str | None, config: Mapping[str, Any], log_dir: str):
        try:
            import wandb
        except ImportError as e:
            raise TrackerUnavailableError(
                "The 'wandb' tracker needs the wandb package: `pip install wandb` and `wandb login` (or set "
                "WANDB_MODE=offline); or drop 'wandb' from TrainerConfig.trackers."
            ) from e
        if not fsx.is_local(log_dir):
            local_dir = tempfile.mkdtemp(prefix="levanter-wandb-")
            logger.info("W&B keeps its local run files in %s (it cannot write to %s); the run syncs to W&B as usual.",
                        local_dir, log_dir)
            log_dir = local_dir
        self._wandb = wandb
        self._run = wandb.init(project=project, name=run_name, config=dict(config), dir=log_dir, resume="allow")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        for k, v in metrics.items():
            self._run.summary[k] = v

    def flush(self) -> None:
        pass  # W&B streams to its server by itself

    def close(self) -> None:
        self._run.finish()
