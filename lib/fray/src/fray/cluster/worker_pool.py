"""A warm pool of ``spawn`` worker processes that a local client's ``map`` calls share.

Starting a spawn worker means a new interpreter importing the user's script and everything a task
needs (numpy, the tokenizer library, ...): about a second on a small machine. A pipeline of many
short stages (zephyr runs each stage as one ``map`` call) would pay it per stage, so the workers
stay up between calls and go away after ``idle_s`` seconds without one, which frees their memory
before long work in the parent (training) needs it.

Each call's function travels once, as bytes or, when large, as a temporary file the workers read
(a tokenizer can weigh megabytes; sending it with every task would copy it per shard); a worker
unpickles it once and keeps the last few (:func:`load_shipped`). Sharing has two consequences that
separate pools did not have: a worker that dies breaks the pool for every call running on it (each
sees a lost worker, and the next task starts a new pool), and after a permanent failure a call
stops the workers only when no other call is using them (otherwise its queued tasks are cancelled
and its running ones finish unobserved).

A spawn worker starts with the parent's environment variables, working directory and ``sys.path``
as they are then. A program that changes them later (credentials set for one step, a test's
``monkeypatch``) must not get workers holding the old ones: when they differ from what the
running workers started with, the next task goes to new workers and the old ones stop once their
tasks are done.

Workers share the machine's cores: each starts with ``RAYON_NUM_THREADS`` set to its share of them
(cores / workers, at least 1) unless the environment already sets it. Rust libraries that run their
own thread pool (the tokenizer library's ``encode_batch``) otherwise start one thread per core in
every worker, and with one worker per core those threads wait for each other's cores, spinning
when they run out of work: on a tokenize step of 833,925 documents on two cores that took 495
CPU-seconds where the split takes 388, for the same ids.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import hashlib
import os
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cloudpickle

# Workers with no call for this long are stopped.
IDLE_SHUTDOWN_S = 10.0
# A function pickled larger than this travels as a temporary file rather than with each task.
INLINE_FUNCTION_BYTES = 1 << 20
# How often a worker checks that the process that started it is still there.
PARENT_CHECK_S = 1.0
# Functions a worker keeps unpickled: calls running side by side each find theirs.
_KEPT_FUNCTIONS = 4


@dataclass(frozen=True)
class ShippedFile:
    """A pickled function in a file on this machine (see :func:`load_shipped`)."""

    path: str


_loaded: OrderedDict[str, Callable[[Any], Any]] = OrderedDict()  # per worker, by call key


def load_shipped(key: str, shipped: bytes | ShippedFile) -> Callable[[Any], Any]:
    """The function of call ``key``, unpickled once per worker (the last few are kept)."""
    fn = _loaded.get(key)
    if fn is None:
        if isinstance(shipped, ShippedFile):
            with open(shipped.path, "rb") as handle:
                shipped = handle.read()
        fn = _loaded[key] = cloudpickle.loads(shipped)
        while len(_loaded) > _KEPT_FUNCTIONS:
            _loaded.popitem(last=False)
    else:
        _loaded.move_to_end(key)
    return fn


@contextmanager
def shipped_function(fn: Callable[[Any], Any]) -> Iterator[bytes | ShippedFile]:
    """``fn`` pickled: as bytes, or in a temporary file (removed afterwards) when large."""
    blob = cloudpickle.dumps(fn)
    if len(blob) <= INLINE_FUNCTION_BYTES:
        yield blob
        return
    handle, path = tempfile.mkstemp(prefix="fray-map-", suffix=".pkl")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(blob)
        yield ShippedFile(path)
    finally:
        os.unlink(path)


def _spawn_context() -> str:
    """A digest of what a spawned worker inherits from this process when it starts."""
    state = (sorted(os.environ.items()), os.getcwd(), list(sys.path))
    return hashlib.sha256(repr(state).encode("utf-8", "surrogateescape")).hexdigest()


def available_cpus() -> int:
    """The CPU cores this process may use (respects affinity masks and container limits on Linux)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def rust_threads_per_worker(workers: int) -> int:
    """The threads a worker's Rust thread pool gets: its share of this machine's cores."""
    return max(1, available_cpus() // max(1, workers))


def _start_worker(started: Any, rust_threads: int) -> None:
    # Read by rayon when the worker first uses a pool, which is after this: the re-import of the
    # user's script does not run tasks.
    os.environ.setdefault("RAYON_NUM_THREADS", str(rust_threads))
    started.set()  # past the re-import of the user's script, the part of start-up that can go wrong
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="fray-parent-watch", daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """End this worker once the process that started it is gone.

    A worker learns of its parent's death only when it asks for its next task; one in the middle of
    a long shard (minutes, on a large input) went on computing, orphaned, for nobody.
    """
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


class WorkerPool:
    """Up to ``workers`` spawn processes, started on demand, shared by calls, stopped when idle."""

    def __init__(self, workers: int, idle_s: float = IDLE_SHUTDOWN_S) -> None:
        self.workers = workers
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._executor: cf.ProcessPoolExecutor | None = None
        self._started: Any = None
        self._context = ""
        self._calls = 0
        self._idle_timer: threading.Timer | None = None

    @contextmanager
    def call(self) -> Iterator[None]:
        """One ``map`` call's use of the pool: no idle stop while it lasts."""
        with self._lock:
            self._calls += 1
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1
                if self._calls == 0 and self._executor is not None:
                    self._idle_timer = threading.Timer(self.idle_s, self._stop_if_idle)
                    self._idle_timer.daemon = True
                    self._idle_timer.start()

    def executor(self) -> tuple[cf.ProcessPoolExecutor, Any]:
        """The running executor (a new one if there is none, or if the workers' start-up context changed)."""
        context = _spawn_context()
        with self._lock:
            if self._executor is not None and context != self._context:
                retired, self._executor = self._executor, None
                retired.shutdown(wait=False)  # its running tasks finish, then its workers exit
            if self._executor is None:
                self._context = context
                # spawn, not fork: a forked child of a process running threads (or JAX) can deadlock.
                context = multiprocessing.get_context("spawn")
                self._started = context.Event()
                self._executor = cf.ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                                        initargs=(self._started, rust_threads_per_worker(self.workers)))
            return self._executor, self._started

    def replace(self, broken: cf.ProcessPoolExecutor) -> None:
        """Forget ``broken`` (a worker died) so that the next task starts a new executor."""
        with self._lock:
            if self._executor is broken:
                self._executor = None
        broken.shutdown(wait=False)  # a broken executor has already failed every task it held

    def stop_if_sole_user(self) -> None:
        """After a permanent failure: terminate the workers, unless another call is using them."""
        with self._lock:
            if self._calls > 1 or self._executor is None:
                return
            executor, self._executor = self._executor, None
        # The executor has no public way to stop running tasks before Python 3.14.
        for process in list((getattr(executor, "_processes", None) or {}).values()):
            if process.is_alive():
                process.terminate()
        executor.shutdown(wait=True, cancel_futures=True)

    def worker_pids(self) -> set[int]:
        with self._lock:
            return set((getattr(self._executor, "_processes", None) or {}).keys()) if self._executor else set()

    def shutdown(self) -> None:
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def _stop_if_idle(self) -> None:
        with self._lock:
            if self._calls or self._executor is None:
                return
            executor, self._executor = self._executor, None
            self._idle_timer = None
        executor.shutdown(wait=True)
