"""The base class of the errors iris raises on purpose (see :mod:`rigging.errors`)."""

from __future__ import annotations

from rigging.errors import ExplainedError


class IrisError(ExplainedError):
    """Base of the errors raised by ``iris``: job orchestration: the job store, supervisors and replicas."""
