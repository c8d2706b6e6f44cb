"""Weights & Biases, imported only when asked for; it never stops or stalls a run.

W&B runs without a prompt and without capturing the console: ``WANDB_MODE=offline`` keeps the
run in local files (``wandb sync`` uploads them later), and a W&B that cannot start (no API key, no
network, a server error) or fails mid-run costs one WARNING, after which the run goes on without it;
``metrics.jsonl`` has every step regardless.

Its local files go to ``<run>/wandb/`` (``WANDB_DIR`` overrides), or, for a run whose folder is a
URL, to a local temporary folder named in a log line. W&B's own ``WANDB_*`` variables keep
precedence over the defaults set here.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Mapping

from levanter.trainer.tracker.base import TrackerUnavailableError
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)

# Quiet and bounded: a run never waits long on a login prompt or on a server that does not answer.
_DEFAULT_SETTINGS = {"console": "off", "silent": True, "init_timeout": 60.0, "login_timeout": 5.0}


def _settings(wandb) -> Any:
    """Our defaults, then the ``WANDB_*`` variables as they are now: W&B itself reads them once per
    process, so without this a second run in the same process would keep the first one's mode."""
    settings = wandb.Settings(**_DEFAULT_SETTINGS)
    update_from_environment = getattr(settings, "update_from_env_vars", None)
    if update_from_environment is not None:
        update_from_environment(dict(os.environ))
    return settings


class WandbTracker:
    """Logs each step's scalars to a W&B run; after a failure it logs nothing (see the module docstring)."""

    def __init__(self, *, project: str | None, run_name: str | None, config: Mapping[str, Any], log_dir: str):
        try:
            import wandb
        except ImportError as e:
            raise TrackerUnavailableError(
                "The 'wandb' tracker needs the wandb package: `pip install wandb` and `wandb login` (or set "
                "WANDB_MODE=offline); or drop 'wandb' from TrainerConfig.trackers."
            ) from e
        if not fsx.is_local(log_dir) and "WANDB_DIR" not in os.environ:
            local_dir = tempfile.mkdtemp(prefix="levanter-wandb-")
            logger.info("W&B keeps its local run files in %s (it cannot write to %s).", local_dir, log_dir)
            log_dir = local_dir
        directory = None if "WANDB_DIR" in os.environ else fsx.absolute(log_dir)
        self._run = None
        try:
            self._run = wandb.init(
                project=project, name=run_name, config=dict(config), dir=directory, resume="allow",
                settings=_settings(wandb),
            )
        except Exception as e:  # whatever W&B raises (usage, auth, network, timeout), the run goes on
            self._give_up("could not start", e)
            return
        if getattr(self._run, "disabled", False) and os.environ.get("WANDB_MODE") != "disabled":
            logger.warning("W&B started a disabled run (no login in time?); this run logs to metrics.jsonl only.")
        elif getattr(self._run, "offline", False):
            logger.info("W&B runs offline; its files are in %s (`wandb sync` that folder to upload them).",
                        os.path.dirname(self._run.settings.sync_file))

    def _give_up(self, what: str, error: BaseException) -> None:
        logger.warning(
            "W&B %s (%s: %s); the run goes on without it and metrics.jsonl keeps every step. "
            "WANDB_MODE=offline keeps a local W&B run instead.", what, type(error).__name__, error,
        )
        self._run = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._run is None:
            return
        try:
            self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)
        except Exception as e:
            self._give_up(f"failed at step {step}", e)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        if self._run is None:
            return
        try:
            for k, v in metrics.items():
                self._run.summary[k] = v
        except Exception as e:
            self._give_up("failed to record the summary", e)

    def flush(self) -> None:
        pass  # W&B streams its records by itself

    def close(self) -> None:
        if self._run is None:
            return
        run, self._run = self._run, None
        try:
            run.finish()
        except Exception as e:
            self._give_up("failed to finish", e)
