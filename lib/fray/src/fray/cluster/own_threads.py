"""Each call in a thread of its own, without starting a thread per call.

A call never waits for another (as a task on a cluster does not): it takes a thread that is idle,
or a new one when none is. A thread that finished a call waits :data:`IDLE_S` for the next one,
then ends. So a run of thousands of short calls (a graph of small steps) uses as many threads as
ran at once, not one per call.

Each call runs in a fresh :mod:`contextvars` context, as it would in a new thread; what a call
leaves in a ``threading.local`` stays with its thread. The threads are daemons, yet the
interpreter still waits at exit for the calls that are running, as it would for plain threads.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextvars
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any

# How long a thread with nothing to do waits for another call before it ends.
IDLE_S = 30.0

_numbers = itertools.count()
_lock = threading.Lock()
_idle: list[_Thread] = []  # threads waiting for a call, the most recently used last
_running: set[cf.Future] = set()


class _Thread:
    def __init__(self) -> None:
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=f"fray-local-{next(_numbers)}", daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                call = self.calls.get(timeout=IDLE_S)
            except queue.Empty:
                with _lock:
                    if self in _idle:
                        _idle.remove(self)
                        return
                call = self.calls.get()  # taken off the idle list just now: its call is on the way
            future, fn, args, kwargs = call
            contextvars.Context().run(settle, future, fn, args, kwargs)
            with _lock:
                _running.discard(future)
                _idle.append(self)


def settle(future: cf.Future, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Run ``fn`` for ``future`` (unless it was cancelled first): its result or its exception."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as error:  # noqa: BLE001 - the caller's future carries it
        future.set_exception(error)


def call_in_own_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> cf.Future:
    """``fn(*args, **kwargs)`` in a thread of its own (an idle one, or a new one); its future."""
    future: cf.Future = cf.Future()
    with _lock:
        worker = _idle.pop() if _idle else None
        _running.add(future)
    if worker is None:
        worker = _Thread()
        worker.calls.put((future, fn, args, kwargs))
        worker.thread.start()
    else:
        worker.calls.put((future, fn, args, kwargs))
    return future


@atexit.register
def _wait_for_running_calls() -> None:
    with _lock:
        running = list(_running)
    cf.wait(running)
