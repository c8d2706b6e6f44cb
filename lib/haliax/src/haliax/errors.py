"""The base class of the errors haliax raises on purpose (see :mod:`rigging.errors`)."""

from __future__ import annotations

from rigging.errors import ExplainedError


class HaliaxError(ExplainedError):
    """Base of the errors raised by ``haliax``: named axes, layers and partitioning."""
