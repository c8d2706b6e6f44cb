"""``LocalClient``: run remote functions, actors and jobs on this machine.

``LocalClient()`` runs functions and actors in threads of this process (cheap; what the step
runner uses by default): each remote call gets a thread of its own, so the caller bounds how many
run at once. ``LocalClient(processes=True)`` runs each function in a worker process and each actor
in its own process, so CPU-bound Python runs in parallel and a crash stays contained; callables,
arguments and results travel with cloudpickle, so lambdas and closures work.
``LocalClient(inline=True)`` runs functions in the calling thread, one after another (for tests
and debugging: a breakpoint just works). Jobs always run as child processes.

``map`` runs its tasks on ``max_workers`` threads or processes (default: the cores this process
may use) started for that call; see :mod:`fray.cluster.task_map`.

Resources are advisory here: the work runs on this machine whatever it asks for, so a request
larger than the machine is logged, not refused.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle
from rigging.log import get_logger

from fray.cluster.client import ActorHandle, JobRequest, describe_request
from fray.cluster.process_job import ProcessJob
from fray.cluster.resources import ResourceConfig
from fray.cluster.own_threads import call_in_own_thread
from fray.cluster.task_map import (
    available_cpus,
    call_now,
    map_inline,
    map_on_processes,
    map_on_threads,
    task_name,
)
from fray.cluster.worker_pool import WorkerPool

logger = get_logger(__name__)


def _call_pickled(payload: bytes) -> bytes:
    """Worker-process side of a remote call: unpickle, call, pickle the result (or the exception)."""
    fn, args, kwargs = cloudpickle.loads(payload)
    try:
        return cloudpickle.dumps((True, fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001 - sent back to raise in the caller
        return cloudpickle.dumps((False, exc))


def _unpickle_into(source: cf.Future, target: cf.Future) -> None:
    if target.cancelled():
        return
    error = source.exception()
    if error is not None:
        target.set_exception(error)
        return
    ok, value = cloudpickle.loads(source.result())
    if ok:
        target.set_result(value)
    else:
        target.set_exception(value)


def _actor_process_main(connection: Any, payload: bytes) -> None:
    """Actor process: build the instance, then answer ``(method, args, kwargs)`` messages until ``None``."""
    cls, args, kwargs = cloudpickle.loads(payload)
    try:
        instance = cls(*args, **kwargs)
        connection.send_bytes(cloudpickle.dumps((True, None)))
    except BaseException as exc:  # noqa: BLE001
        connection.send_bytes(cloudpickle.dumps((False, exc)))
        return
    while True:
        try:
            message = connection.recv_bytes()
        except EOFError:
            return
        request = cloudpickle.loads(message)
        if request is None:
            return
        method, args, kwargs = request
        try:
            reply = (True, getattr(instance, method)(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001
            reply = (False, exc)
        connection.send_bytes(cloudpickle.dumps(reply))


class LocalClient:
    """Runs work on this machine; see the module docstring."""

    def __init__(self, *, processes: bool = False, inline: bool = False, max_workers: int | None = None,
                 task_retries: int = 0) -> None:
        if processes and inline:
            raise ValueError("LocalClient runs work in worker processes or inline (in the calling thread), not both.")
        self.processes = processes
        self.inline = inline
        self.max_workers = max_workers or available_cpus()
        self.task_retries = task_retries  # map's default max_retries: a failure here is a bug in the task
        self._lock = threading.Lock()
        self._pool: cf.Executor | None = None
        self._map_pool = WorkerPool(self.max_workers)  # map's workers, kept warm between calls
        self._actors: list[Callable[[], None]] = []
        self._jobs: list[ProcessJob] = []
        self._warned_sizes: set[str] = set()

    @property
    def calls_in_this_process(self) -> bool:
        """Whether :meth:`remote` runs a function in a thread of this process (the default and
        ``inline``), where a caller about to wait for it could as well call it in its own thread."""
        return not self.processes

    def __repr__(self) -> str:
        return "LocalClient(processes=True)" if self.processes else "LocalClient(inline=True)" if self.inline else "LocalClient()"

    # -- remote functions ---------------------------------------------------------------------------

    def _process_pool(self) -> cf.Executor:
        with self._lock:
            if self._pool is None:
                # spawn, not fork: forking a process that runs threads (or JAX) can deadlock the child.
                context = multiprocessing.get_context("spawn")
                self._pool = cf.ProcessPoolExecutor(max_workers=self.max_workers, mp_context=context)
            return self._pool

    def remote(self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> cf.Future:
        self.check_fits(resources, what=getattr(fn, "__name__", "a remote function"))
        if self.inline:
            return call_now(fn, *args, **kwargs)
        if not self.processes:
            return call_in_own_thread(fn, *args, **kwargs)
        inner = self._process_pool().submit(_call_pickled, cloudpickle.dumps((fn, args, kwargs)))
        outer: cf.Future = cf.Future()
        inner.add_done_callback(lambda source: _unpickle_into(source, outer))
        return outer

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *, resources: ResourceConfig | None = None,
            max_retries: int | None = None, on_result: Callable[[int, Any], None] | None = None) -> list:
        items = list(items)
        self.check_fits(resources, what=task_name(fn))
        options = {"max_retries": self.task_retries if max_retries is None else max_retries, "on_result": on_result}
        if self.inline:
            return map_inline(fn, items, **options)
        if self.processes:
            return map_on_processes(fn, items, pool=self._map_pool, **options)
        return map_on_threads(fn, items, workers=self.max_workers, **options)

    # -- actors ------------------------------------------------------------------------------------

    def create_actor(self, cls: type, *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> ActorHandle:
        name = getattr(cls, "__name__", "actor")
        self.check_fits(resources, what=f"actor {name}")
        # One thread per actor serialises its calls, in order, like an actor on a cluster.
        caller = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fray-actor-{name}")
        if not self.processes:
            instance = cls(*args, **kwargs)

            def send(method: str, call_args: tuple, call_kwargs: dict) -> cf.Future:
                return caller.submit(lambda: getattr(instance, method)(*call_args, **call_kwargs))

            def stop() -> None:
                caller.shutdown(wait=False, cancel_futures=True)

        else:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            process = context.Process(
                target=_actor_process_main, args=(child, cloudpickle.dumps((cls, args, kwargs))), daemon=True, name=f"fray-actor-{name}"
            )
            process.start()
            child.close()
            ok, error = cloudpickle.loads(parent.recv_bytes())
            if not ok:
                process.join()
                raise error

            def exchange(method: str, call_args: tuple, call_kwargs: dict) -> Any:
                parent.send_bytes(cloudpickle.dumps((method, call_args, call_kwargs)))
                ok, value = cloudpickle.loads(parent.recv_bytes())
                if not ok:
                    raise value
                return value

            def send(method: str, call_args: tuple, call_kwargs: dict) -> cf.Future:
                return caller.submit(exchange, method, call_args, call_kwargs)

            def stop() -> None:
                caller.shutdown(wait=True, cancel_futures=True)
                if process.is_alive():
                    try:
                        parent.send_bytes(cloudpickle.dumps(None))
                    except OSError:
                        pass
                    process.join(timeout=5)
                    if process.is_alive():
                        process.kill()
                parent.close()

        self._actors.append(stop)
        return ActorHandle(name, send, stop)

    # -- jobs --------------------------------------------------------------------------------------

    def submit(self, request: JobRequest, *, start: bool = True) -> ProcessJob:
        """A child process of this one; its ``free_address`` is on loopback, as every job of this client runs here."""
        self.check_fits(request.resources, what=f"job {request.name!r}")
        job = ProcessJob(request, job_id=f"{request.name}-{uuid.uuid4().hex[:8]}", start=start)
        self._jobs.append(job)
        return job

    # -- resources and lifetime -----------------------------------------------------------------------

    def check_fits(self, resources: ResourceConfig | None, *, what: str = "this request") -> None:
        """Never refuses: this machine runs whatever it is given. Says once when a request is larger."""
        if resources is None:
            return
        cpus = os.cpu_count() or 1
        if resources.cpu > cpus or resources.device_kind != "cpu" or resources.custom:
            key = describe_request(resources)
            if key not in self._warned_sizes:
                self._warned_sizes.add(key)
                logger.info("%s asks for %s; running it on this machine (%d CPUs) anyway", what, key, cpus)

    def shutdown(self) -> None:
        for stop in self._actors:
            stop()
        self._actors.clear()
        for job in self._jobs:
            job.terminate()
        self._jobs.clear()
        self._map_pool.shutdown()
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
