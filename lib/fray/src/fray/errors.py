"""The base class of the errors fray raises on purpose (see :mod:`rigging.errors`)."""

from __future__ import annotations

from rigging.errors import ExplainedError


class FrayError(ExplainedError):
    """Base of the errors raised by ``fray``: where work runs (clients, tasks, jobs, resources)."""
