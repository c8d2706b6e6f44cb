"""TensorBoard event files, written with ``torch.utils.tensorboard`` or ``tensorboardX``.

Those writers append to local files. For a run whose folder is a URL, the event files are written
in a local temporary folder (a log line names it) and copied to ``<run>/tensorboard/`` before each
checkpoint and at the end.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Any, Mapping

from levanter.trainer.tracker.base import TrackerUnavailableError
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)


def _summary_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package too

        return SummaryWriter
    except ImportError:
        pass
    try:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    except ImportError as e:
        raise TrackerUnavailableError(
            "The 'tensorboard' tracker needs a TensorBoard writer: `pip install tensorboard` (used through "
            "torch.utils.tensorboard) or `pip install tensorboardX`; or drop 'tensorboard' from "
            "TrainerConfig.trackers."
        ) from e


class TensorBoardTracker:
    def __init__(self, log_dir: str):
        writer_class = _summary_writer_class()
        self.log_dir = log_dir
        self._local_dir: str | None = None
        if not fsx.is_local(log_dir):
            self._local_dir = tempfile.mkdtemp(prefix="levanter-tensorboard-")
            logger.info(
                "TensorBoard writes its event files locally in %s (its writer cannot write to %s); they are "
                "copied there before each checkpoint and at the end.", self._local_dir, log_dir,
            )
        self._writer = writer_class(log_dir=self._local_dir or log_dir)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for name, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(name, value, step)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        pass

    def flush(self) -> None:
        self._writer.flush()
        self._copy_to_log_dir()

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
        self._copy_to_log_dir()
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)

    def _copy_to_log_dir(self) -> None:
        if self._local_dir is None:
            return
        fsx.upload_files(self._local_dir, fsx.find_files(self._local_dir), self.log_dir)
