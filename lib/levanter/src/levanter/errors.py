"""The base class of the errors levanter raises on purpose (see :mod:`rigging.errors`)."""

from __future__ import annotations

from rigging.errors import ExplainedError


class LevanterError(ExplainedError):
    """Base of the errors raised by ``levanter``: models, data loading, training, checkpoints, evaluation and inference."""
