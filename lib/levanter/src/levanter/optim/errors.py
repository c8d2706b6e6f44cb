"""The optimizer package's errors: one base class to catch for any unusable optimizer setting."""

from __future__ import annotations

from levanter.errors import LevanterError


class OptimizerConfigError(LevanterError, ValueError):
    """An optimizer config that cannot be built, run or read back; the message names the field."""


class ScheduleError(OptimizerConfigError):
    """A learning-rate schedule setting (``lr_schedule``, ``warmup``, ``decay``, ``min_lr_ratio``) that cannot
    be honoured, on its own or for this run's length."""
