"""Where shard tasks run. A backend maps one task function over many payloads, in any order.

The interface is deliberately tiny so that other executors (a Ray cluster through fray) can slot
in: ``run(fn, payloads, shared)`` yields ``(index, result)`` pairs as tasks finish. ``fn`` and
``shared`` are shipped once per worker (cloudpickle), payloads once per task.
"""

from __future__ import annotations

import abc
import logging
import multiprocessing
import os
import pickle
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import cloudpickle

from zephyr.main_guard import check_not_rerunning_main, check_parent_main_guard, startup_failure_hint

logger = logging.getLogger("zephyr")

# Workers that have not started after this long are probably stuck re-running the user's script.
STARTUP_WARNING_S = 60.0


class ShardTaskError(RuntimeError):
    """A shard task failed in a way that could not be sent back as its original exception."""


class Backend(abc.ABC):
    """Runs a task function over payloads; yields ``(payload index, result)`` as tasks finish."""

    @abc.abstractmethod
    def run(self, fn: Callable[[Any, Mapping[str, Any]], Any], payloads: Sequence[Any],
            shared: Mapping[str, Any]) -> Iterator[tuple[int, Any]]:
        ...


class InProcessBackend(Backend):
    """Runs every task in the calling process, one after another: for tests and debugging."""

    def run(self, fn, payloads, shared):
        for index, payload in enumerate(payloads):
            yield index, fn(payload, shared)

    def __repr__(self) -> str:
        return "InProcessBackend()"


# Per worker process: the task function and shared objects, unpickled once by the initializer.
_worker_fn: Callable | None = None
_worker_shared: Mapping[str, Any] = {}


def _init_worker(fn_blob: bytes, shared_blob: bytes, started) -> None:
    global _worker_fn, _worker_shared
    started.set()  # past the re-import of the user's script, the part of start-up that can go wrong
    _worker_fn = cloudpickle.loads(fn_blob)
    _worker_shared = cloudpickle.loads(shared_blob)


def _run_in_worker(payload: Any) -> Any:
    try:
        return _worker_fn(payload, _worker_shared)
    except Exception as error:
        # The driver should see the user's own exception (an InputFileError, say), so send it
        # back as is when it pickles; otherwise as text with the worker's traceback.
        try:
            pickle.dumps(error)
        except Exception:
            raise ShardTaskError(f"{type(error).__name__}: {error}\n{traceback.format_exc()}") from None
        raise


def _terminate_workers(executor: ProcessPoolExecutor) -> None:
    # The executor has no public way to stop running tasks before Python 3.14.
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


def default_worker_count() -> int:
    """The CPU cores this process may use (respects affinity masks and container limits on Linux)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class ProcessPoolBackend(Backend):
    """Runs tasks on a pool of local worker processes (default: one per CPU core).

    Workers are started with ``spawn`` so they never inherit the driver's threads or accelerator
    state (forking a process that has initialised JAX is unsafe). Functions travel with cloudpickle,
    so lambdas and closures work.
    """

    def __init__(self, max_workers: int | None = None, start_method: str = "spawn"):
        self.max_workers = max_workers or default_worker_count()
        self.start_method = start_method

    def run(self, fn, payloads, shared):
        if not payloads:
            return
        # Before any worker exists: a script without the __main__ guard would make each worker
        # start this pipeline again, and a worker doing so must refuse rather than recurse.
        check_not_rerunning_main()
        check_parent_main_guard(self.start_method)
        fn_blob = cloudpickle.dumps(fn)
        shared_blob = cloudpickle.dumps(dict(shared))
        workers = min(self.max_workers, len(payloads))
        context = multiprocessing.get_context(self.start_method)
        started = context.Event()
        executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                       initargs=(fn_blob, shared_blob, started))
        finished = False
        try:
            futures = {executor.submit(_run_in_worker, payload): index for index, payload in enumerate(payloads)}
            pending = set(futures)
            waiting_since = time.monotonic()
            while pending:
                done, pending = wait(pending, timeout=STARTUP_WARNING_S, return_when=FIRST_COMPLETED)
                if not done and not started.is_set() and waiting_since is not None:
                    logger.warning(
                        "zephyr: no worker process has started after %.0fs; %s.",
                        time.monotonic() - waiting_since, startup_failure_hint(),
                    )
                    waiting_since = None  # say it once
                for future in done:
                    try:
                        result = future.result()
                    except BrokenProcessPool as error:
                        if not started.is_set():
                            raise ShardTaskError(
                                "zephyr's worker processes exited while starting, before running any shard (their "
                                f"error is shown above): {startup_failure_hint()}"
                            ) from error
                        raise ShardTaskError(
                            "a zephyr worker process died (killed, or out of memory?) while running shard "
                            f"task {futures[future]}; rerun with fewer workers or smaller shards"
                        ) from error
                    yield futures[future], result
            finished = True
        finally:
            if not finished:
                # A failed shard fails the run: stop the other workers now rather than let long
                # shards run to the end (their outputs are atomic, so nothing partial remains).
                _terminate_workers(executor)
            executor.shutdown(wait=True, cancel_futures=True)

    def __repr__(self) -> str:
        return f"ProcessPoolBackend(max_workers={self.max_workers})"


def resolve_backend(backend: Backend | str | None) -> Backend:
    """``None`` or ``"processes"`` gives the process pool (the default), ``"inline"`` runs in-process,
    ``"ray"`` runs shards as Ray tasks (:class:`zephyr.ray_backend.RayBackend`)."""
    if isinstance(backend, Backend):
        return backend
    if backend in (None, "processes", "process_pool"):
        return ProcessPoolBackend()
    if backend in ("inline", "in_process", "sync"):
        return InProcessBackend()
    if backend == "ray":
        # Imported here so that Ray stays optional.
        from zephyr.ray_backend import RayBackend

        return RayBackend()
    raise ValueError(f"unknown zephyr backend {backend!r}; use 'processes', 'inline', 'ray' or a Backend instance")
