"""The base class of the errors marin raises on purpose (see :mod:`rigging.errors`)."""

from __future__ import annotations

from rigging.errors import ExplainedError


class MarinError(ExplainedError):
    """Base of the errors raised by ``marin``: the engine, datasets, experiments, evaluation and reports."""
