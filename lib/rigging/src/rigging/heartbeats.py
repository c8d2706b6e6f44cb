"""One thread that keeps the time of every heartbeat of this process.

A step runner holds a lease per step it runs: thousands over a large graph, dozens at once, each to
be renewed every few seconds while its step runs. A thread per lease would start and stop a thread
per step, though most small steps end before their first beat is due. Here one thread keeps the
due times of all of them and starts each beat when due, in a short thread of its own: a slow write
(a request to an object store, a hung disk) delays no other lease's beat, and a lease released
before its first beat costs no thread at all.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rigging.log import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True, eq=False)
class _Beat:
    interval_s: float
    beat: Callable[[], bool]
    stop: threading.Event
    name: str


class Heartbeats:
    """Calls each registered beat every ``interval_s`` seconds, from :meth:`every` until it is stopped."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int, _Beat]] = []  # a heap by due time (monotonic)
        self._order = itertools.count()  # ties broken by registration, never by comparing beats
        self._thread: threading.Thread | None = None

    def every(self, interval_s: float, beat: Callable[[], bool], stop: threading.Event, *, name: str = "heartbeat") -> None:
        """Call ``beat()`` every ``interval_s`` seconds, each ``interval_s`` after the last one
        returned, until ``stop`` is set or ``beat`` answers False. An exception it raises is logged
        and the beats go on (a flaky filesystem must not end them silently)."""
        self._schedule(time.monotonic() + interval_s, _Beat(interval_s, beat, stop, name))

    def _schedule(self, at: float, beat: _Beat) -> None:
        with self._changed:
            heapq.heappush(self._due, (at, next(self._order), beat))
            if self._thread is None:
                self._thread = threading.Thread(target=self._keep_time, name="heartbeats", daemon=True)
                self._thread.start()
            elif self._due[0][2] is beat:
                self._changed.notify()  # due before what the thread is waiting for

    def _keep_time(self) -> None:
        while True:
            with self._changed:
                while True:
                    while self._due and self._due[0][2].stop.is_set():
                        heapq.heappop(self._due)  # released: forgotten without waiting for its time
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    if wait is not None and wait <= 0:
                        beat = heapq.heappop(self._due)[2]
                        break
                    self._changed.wait(wait)
            threading.Thread(target=self._run, args=(beat,), name=beat.name, daemon=True).start()

    def _run(self, beat: _Beat) -> None:
        if beat.stop.is_set():
            return
        try:
            again = beat.beat()
        except Exception as exc:  # noqa: BLE001 - see every()
            logger.warning("%s failed: %s", beat.name, exc)
            again = True
        if again and not beat.stop.is_set():
            self._schedule(time.monotonic() + beat.interval_s, beat)

    def _forget_after_fork(self) -> None:
        # A forked child has none of the parent's threads, and holds none of its leases.
        self._changed = threading.Condition()
        self._due = []
        self._thread = None


HEARTBEATS = Heartbeats()
os.register_at_fork(after_in_child=HEARTBEATS._forget_after_fork)
