"""``client.map(fn, items)``: many tasks in one call, with the same contract on every client.

* ``fn`` is unpickled once per worker and call, not once per item; a large one (over 1 MiB: a
  tokenizer, a vocabulary) travels once per call, as a file for local processes or an object in
  Ray's store, a small one with each task. Each item travels with its own task.
* Results come back as a list in the order of ``items``; ``on_result(index, result)`` is called in
  the caller's thread as each task finishes, in finishing order (for progress and running totals).
* A task that fails runs again, up to ``max_retries`` times, while finished tasks keep their
  results (not one the cluster cannot place: :class:`UnschedulableError` and its timeouts). Each client has its own default (``task_retries``): none locally, where a failure is a
  bug in the task; two on Ray, where nodes come and go.
* A task that fails for good stops the others: queued tasks are cancelled, running ones stopped
  where the client can (worker processes are terminated unless another call shares them, Ray
  tasks cancelled; a thread runs to its end), and the caller gets the task's own exception, or a
  :class:`TaskError` saying why not.

The driver loop is shared by every client; a client says how one task is submitted, what its raw
errors mean, and how to stop its workers. The local flavours (inline, threads, processes) live
here too; ``RayClient.map`` is in :mod:`fray.cluster.ray_client`.
"""

from __future__ import annotations

import concurrent.futures as cf
import pickle
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import cloudpickle
from rigging.log import get_logger

from fray.cluster.client import UnschedulableError
from fray.cluster.own_threads import settle
from fray.cluster.main_guard import (
    check_not_rerunning_main,
    check_parent_main_guard,
    startup_failure_hint,
)
from fray.cluster.worker_pool import (
    ShippedFile,
    WorkerPool,
    available_cpus,
    load_shipped,
    shipped_function,
)
from fray.errors import FrayError

logger = get_logger(__name__)

# Worker processes that have not started after this long are probably stuck re-running the user's script.
STARTUP_WARNING_S = 60.0


class TaskError(FrayError, RuntimeError):
    """A task of ``client.map`` failed in a way that could not be sent back as its own exception."""


class WorkerLostError(TaskError):
    """The process running a task died (killed, out of memory?) before the task finished."""


class WorkerStartupError(TaskError):
    """Worker processes exited while starting, before running any task: retrying cannot help."""


def task_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def run_tasks(
    submit: Callable[[int], cf.Future],
    count: int,
    *,
    name: str,
    max_retries: int,
    on_result: Callable[[int, Any], None] | None = None,
    window: int | None = None,
    explain: Callable[[int, BaseException], BaseException] = lambda index, error: error,
    stop: Callable[[], None] = lambda: None,
    poll_s: float | None = None,
    on_wait: Callable[[], None] = lambda: None,
) -> list:
    """Run tasks ``0 .. count-1`` through ``submit(index)`` and return their results in order.

    ``window``: at most this many tasks in flight (``None``: all at once). ``explain`` turns a raw
    error of a future into the one to retry or raise. ``stop`` ends running work after a permanent
    failure. ``on_wait`` runs every ``poll_s`` seconds during which no task finished.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    results: list[Any] = [None] * count
    attempts = [0] * count
    to_submit = deque(range(count))
    running: dict[cf.Future, int] = {}
    finished = False
    try:
        while to_submit or running:
            while to_submit and (window is None or len(running) < window):
                index = to_submit.popleft()
                attempts[index] += 1
                running[submit(index)] = index
            done, _ = cf.wait(running, timeout=poll_s, return_when=cf.FIRST_COMPLETED)
            if not done:
                on_wait()
            for future in done:
                index = running.pop(future)
                try:
                    results[index] = future.result()
                except Exception as raw:
                    error = explain(index, raw)
                    # Neither a worker that cannot start nor a node the cluster cannot provide comes
                    # back by asking again at once.
                    if attempts[index] > max_retries or isinstance(error, (WorkerStartupError, UnschedulableError)):
                        if error is raw:
                            raise
                        raise error from raw
                    first_line = (str(error).strip().splitlines() or [""])[0]
                    logger.warning("%s: task %d failed (%s: %s); retrying, attempt %d of %d", name, index,
                                   type(error).__name__, first_line, attempts[index] + 1, max_retries + 1)
                    to_submit.appendleft(index)
                    continue
                if on_result is not None:
                    on_result(index, results[index])
        finished = True
        return results
    finally:
        if not finished:
            for future in running:
                future.cancel()
            stop()


# -- worker side ---------------------------------------------------------------------------------


def call_reporting_errors(fn: Callable[[Any], Any], item: Any, dumps: Callable[[Any], bytes]) -> Any:
    """One task in a worker: the task's own exception when it can travel back, else its text."""
    try:
        return fn(item)
    except Exception as error:
        try:
            dumps(error)
        except Exception:
            raise TaskError(f"{type(error).__name__}: {error}\n{traceback.format_exc()}") from None
        raise


def call_shipped(key: str, shipped: bytes | ShippedFile, item: Any) -> Any:
    """A task of a worker that serves many map calls: each call's function is unpickled once."""
    return call_reporting_errors(load_shipped(key, shipped), item, cloudpickle.dumps)


def _call_in_process_worker(key: str, shipped: bytes | ShippedFile, item: Any) -> Any:
    return call_reporting_errors(load_shipped(key, shipped), item, pickle.dumps)


# -- local flavours -------------------------------------------------------------------------------


def call_now(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> cf.Future:
    """``fn(*args, **kwargs)`` in the calling thread, as a finished future."""
    future: cf.Future = cf.Future()
    settle(future, fn, args, kwargs)
    return future


def map_inline(fn: Callable[[Any], Any], items: Sequence[Any], **options: Any) -> list:
    """Each task in the calling thread, one after another; after a permanent failure none starts."""
    return run_tasks(lambda index: call_now(fn, items[index]), len(items), name=task_name(fn), window=1, **options)


def map_on_threads(fn: Callable[[Any], Any], items: Sequence[Any], *, workers: int, **options: Any) -> list:
    """Tasks on a pool of threads of this process. A running thread cannot be stopped: after a
    permanent failure the queued tasks are cancelled and the running ones finish before this returns."""
    with cf.ThreadPoolExecutor(max_workers=max(1, min(workers, len(items))), thread_name_prefix="fray-map") as pool:
        return run_tasks(lambda index: pool.submit(fn, items[index]), len(items), name=task_name(fn), **options)


def map_on_processes(fn: Callable[[Any], Any], items: Sequence[Any], *, pool: WorkerPool, **options: Any) -> list:
    """Tasks on the warm ``spawn`` worker processes of ``pool`` (see :mod:`fray.cluster.worker_pool`).

    ``spawn``, not ``fork``: a forked child of a process running threads (or JAX) can deadlock.
    A worker that dies breaks the pool, so every unfinished task counts it as a failed attempt; a
    retry starts a new pool. Workers that die while starting fail the call at once.
    """
    if not items:
        return []
    # Before any worker exists: a script without the __main__ guard would make each worker start
    # this work again, and a worker doing so must refuse rather than recurse.
    check_not_rerunning_main()
    check_parent_main_guard("spawn")
    name = task_name(fn)
    key = uuid.uuid4().hex
    started_events: dict[int, Any] = {}  # by id of the executor a task went to

    def submit_to(shipped: bytes | ShippedFile, index: int) -> cf.Future:
        executor, started = pool.executor()
        try:
            future = executor.submit(_call_in_process_worker, key, shipped, items[index])
        except BrokenProcessPool:  # a retry after a worker died
            pool.replace(executor)
            executor, started = pool.executor()
            future = executor.submit(_call_in_process_worker, key, shipped, items[index])
        started_events[id(future)] = started
        return future

    def explain(index: int, error: BaseException) -> BaseException:
        if not isinstance(error, BrokenProcessPool):
            return error
        if not any(started.is_set() for started in started_events.values()):
            return WorkerStartupError(f"{name}: the worker processes exited while starting, before running any task "
                                      f"(their error is shown above): {startup_failure_hint()}")
        return WorkerLostError(f"{name}: a worker process died (killed, or out of memory?) while running task "
                               f"{index}; rerun with fewer workers or smaller tasks")

    waiting_since = time.monotonic()
    warned = []

    def warn_if_not_started() -> None:
        if not warned and not any(started.is_set() for started in started_events.values()):
            warned.append(True)  # say it once
            logger.warning("%s: no worker process has started after %.0fs; %s.", name,
                           time.monotonic() - waiting_since, startup_failure_hint())

    with pool.call(), shipped_function(fn) as shipped:
        return run_tasks(lambda index: submit_to(shipped, index), len(items), name=name, explain=explain,
                         stop=pool.stop_if_sole_user, poll_s=STARTUP_WARNING_S, on_wait=warn_if_not_started,
                         **options)
