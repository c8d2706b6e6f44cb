"""A tracker receives one flat dict of scalars per step and stores it somewhere."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from levanter.errors import LevanterError


class TrackerUnavailableError(LevanterError, RuntimeError):
    """A configured tracker whose library is not installed."""


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def log_summary(self, metrics: Mapping[str, Any]) -> None: ...

    def flush(self) -> None:
        """Store what was logged so far where readers look for it (called before each checkpoint)."""
        ...

    def close(self) -> None: ...
