"""How many of a run's step attempts do the engine's own work at once.

Each step of a run waits in a thread of the run's pool (up to ``max_concurrent``, 32 by default),
and around the step's function the engine does work of its own: the lease, the fenced records,
``.executor_info``, the attempt log, the commit. On local disk that work is short system calls
under Python's global lock, and dozens of threads doing it at once spend more time handing the
lock to each other than working (a graph of thousands of small steps ran a third slower at 32
than at 4). So on local disk at most :func:`local_slots` attempts do engine work at a time; the
steps' functions still run up to ``max_concurrent`` at once, since a slot is given up while the
function runs and while an attempt sleeps waiting on another process. On an object store each
record is a request of tens of milliseconds, so there the limit is the run's own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator


def local_slots() -> int:
    """Engine work at once on local disk: enough to overlap one attempt's ``fsync`` with another's work."""
    return max(4, 2 * (os.cpu_count() or 1))


class EngineSlots:
    """At most ``count`` threads inside :meth:`held` at once (``None``: no limit)."""

    def __init__(self, count: int | None) -> None:
        self._free = threading.BoundedSemaphore(count) if count is not None else None
        self._holding = threading.local()

    def _holds(self) -> bool:
        return getattr(self._holding, "slot", False)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold a slot for the block (at once when this thread holds one already)."""
        if self._free is None or self._holds():
            yield
            return
        self._free.acquire()
        self._holding.slot = True
        try:
            yield
        finally:
            self._holding.slot = False
            self._free.release()

    @contextlib.contextmanager
    def given_up(self) -> Iterator[None]:
        """Let others have this thread's slot for the block (a step's function, a wait)."""
        if self._free is None or not self._holds():
            yield
            return
        self._holding.slot = False
        self._free.release()
        try:
            yield
        finally:
            self._free.acquire()
            self._holding.slot = True

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` with the slot given up meanwhile."""
        with self.given_up():
            time.sleep(seconds)
