"""What a shard task sees while it runs: its place in the stage, counters, shared objects.

Inside any function a pipeline runs (a ``map`` fn, a reader, a writer) call
:func:`current_worker_context` to get it. Counters are summed over all shards and returned to the
driver with the result; shared objects are read-only values shipped once per worker (a tokenizer,
a vocabulary) instead of once per closure.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from zephyr.errors import ZephyrError


class NoWorkerContextError(ZephyrError, RuntimeError):
    """Raised when code asks for the worker context outside a running shard task."""


@dataclass
class WorkerContext:
    shard_index: int
    num_shards: int
    stage_index: int = 0
    num_stages: int = 1
    shared: Mapping[str, Any] = field(default_factory=dict)
    counters: Counter = field(default_factory=Counter)

    def increment(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name``; the driver receives the sum over every shard."""
        self.counters[name] += amount

    def get_shared(self, name: str) -> Any:
        try:
            return self.shared[name]
        except KeyError:
            available = ", ".join(sorted(self.shared)) or "none"
            raise KeyError(f"no shared object {name!r} in this pipeline run (available: {available}); "
                           "pass it with shared={...} when running the dataset") from None


_current: contextvars.ContextVar[WorkerContext | None] = contextvars.ContextVar("zephyr_worker_context", default=None)


def current_worker_context() -> WorkerContext:
    """The context of the shard task running now; raises outside a task."""
    context = _current.get()
    if context is None:
        raise NoWorkerContextError("no zephyr shard task is running; the worker context exists only inside one")
    return context


def try_current_worker_context() -> WorkerContext | None:
    """The running task's context, or None (for code that may also run outside a pipeline)."""
    return _current.get()


@contextlib.contextmanager
def active_worker_context(context: WorkerContext) -> Iterator[WorkerContext]:
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def count(name: str, amount: int = 1) -> None:
    """Increment a counter of the running task, if there is one (a no-op outside pipelines)."""
    context = _current.get()
    if context is not None:
        context.increment(name, amount)
