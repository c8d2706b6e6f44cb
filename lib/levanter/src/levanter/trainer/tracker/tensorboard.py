"""TensorBoard event files, written with ``torch.utils.tensorboard`` or ``tensorboardX``."""

from __future__ import annotations

from typing import Any, Mapping

from levanter.trainer.tracker.base import TrackerUnavailableError


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
        self._writer = _summary_writer_class()(log_dir=log_dir)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for name, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(name, value, step)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
