"""The ``DistributedClient`` protocol: how a program asks a cluster to run work.

Four shapes of work, the same on every backend:

* **remote functions**: ``client.remote(fn, *args, resources=..., **kwargs)`` returns a
  :class:`concurrent.futures.Future` with ``fn``'s return value;
* **many tasks**: ``client.map(fn, items, resources=..., max_retries=...)`` runs ``fn(item)`` for
  every item, retries failed tasks, stops the rest when one fails for good and returns the results
  in order (see :mod:`fray.cluster.task_map`);
* **actors**: ``client.create_actor(cls, *args, resources=...)`` starts one long-lived instance
  and returns an :class:`ActorHandle`; ``handle.method.remote(...)`` returns a future. Calls to one
  actor run one at a time, in the order they were made, so the actor's state is never raced;
* **jobs**: ``client.submit(JobRequest(...))`` runs a command or a callable in its own process and
  returns a :class:`JobHandle` (``wait``, ``status``, ``logs``, ``terminate``). This is the one way
  a program becomes a process somewhere; iris builds retries and gang replicas on it.

Futures are plain ``concurrent.futures.Future`` objects, so ``concurrent.futures.wait`` and
``as_completed`` work across backends.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fray.cluster.resources import ResourceConfig
from fray.errors import FrayError


class UnschedulableError(FrayError, ValueError):
    """A request asks for more than any node of the cluster can ever provide.

    Raised when the work is submitted, instead of letting it wait in a queue forever.
    """


class ScaleUpTimeout(UnschedulableError, TimeoutError):
    """A request no live node could hold waited for the cluster's autoscaler longer than its
    ``ResourceConfig.scale_up_timeout_s``, and no node that can hold it joined."""


_TAG = re.compile(r"[A-Za-z0-9_.:=-]{1,200}")


class InvalidJobRequest(FrayError, ValueError):
    """A ``JobRequest`` that cannot be run as written."""


class JobStatus(enum.Enum):
    PENDING = "PENDING"  # placed, not started (``submit(..., start=False)``)
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # a non-zero exit, or a command that could not start (exit code 127)
    STOPPED = "STOPPED"  # ended by ``terminate()``
    LOST = "LOST"  # the machine or worker that held it went away; its exit is unknown
    TIMED_OUT = "TIMED_OUT"  # ended by the cluster at its time limit (``JobRequest.time_limit_s``)

    @property
    def finished(self) -> bool:
        return self not in (JobStatus.PENDING, JobStatus.RUNNING)


@dataclass(frozen=True)
class JobRequest:
    """A job: a command (``["python", "train.py"]``) or a Python callable, with its resources.

    A callable ``entrypoint`` is called with ``args`` and ``kwargs`` in a fresh process (shipped
    there with cloudpickle); a command is run as is. ``env`` adds environment variables. ``cwd`` is
    the working directory where it exists on the machine that runs the job (elsewhere the worker's own).
    ``time_limit_s``: wall-clock seconds after which a cluster with time limits (Slurm) ends the job
    (``TIMED_OUT``); clients without them ignore it. ``tag``: a label the cluster keeps with the job,
    by which any process can find it again (Slurm: its comment, :meth:`SlurmClient.tagged_jobs`);
    letters, digits and ``-_.:=`` only; clients that keep none ignore it.
    """

    name: str
    entrypoint: Callable[..., Any] | Sequence[str]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    time_limit_s: float | None = None
    tag: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise InvalidJobRequest("A job needs a non-empty name, e.g. JobRequest(name='tokenize', ...).")
        if self.tag is not None and not _TAG.fullmatch(self.tag):
            raise InvalidJobRequest(f"Job {self.name!r}: a tag holds letters, digits and -_.:= only, got {self.tag!r}.")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InvalidJobRequest(f"Job {self.name!r}: time_limit_s must be positive seconds or None, got {self.time_limit_s!r}.")
        if callable(self.entrypoint):
            return
        if isinstance(self.entrypoint, str):
            raise InvalidJobRequest(
                f"Job {self.name!r}: give the command as a list of arguments, e.g. {self.entrypoint.split()!r}, "
                "not as one string."
            )
        command = list(self.entrypoint)
        if not command or not all(isinstance(part, str) for part in command):
            raise InvalidJobRequest(f"Job {self.name!r}: entrypoint must be a callable or a non-empty list of strings.")
        if self.args or self.kwargs:
            raise InvalidJobRequest(f"Job {self.name!r}: args and kwargs apply to callables; put a command's arguments in the list.")
        object.__setattr__(self, "entrypoint", tuple(command))

    @property
    def is_command(self) -> bool:
        return not callable(self.entrypoint)


@runtime_checkable
class JobHandle(Protocol):
    """A submitted job: one process on the machine the client chose, in a session of its own."""

    job_id: str

    def status(self) -> JobStatus: ...

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job finishes (or ``timeout`` seconds pass) and return its status."""
        ...

    def exit_code(self) -> int | None:
        """The process's exit status (negative: killed by that signal), ``None`` until it exits or when LOST."""
        ...

    def logs(self) -> str:
        """Everything the job wrote to stdout and stderr so far."""
        ...

    def read_log(self, offset: int = 0) -> bytes:
        """The job's output from byte ``offset`` on, at most 4 MiB a call: for following it as it runs."""
        ...

    def terminate(self) -> None:
        """Stop the job: SIGTERM to its process group, SIGKILL after a grace period."""
        ...

    def free_address(self) -> str:
        """``HOST:PORT``, free now on the job's machine, as other machines reach it (for a server the job will run)."""
        ...

    def start(self, env: Mapping[str, str] | None = None) -> None:
        """Start a job submitted with ``start=False``; ``env`` adds to (and overrides) the request's."""
        ...

    def release(self) -> None:
        """Stop the job if it runs and free what holds it (its resources, its log); status and exit code stay."""
        ...


class ActorMethod:
    """``handle.method``: call ``.remote(*args, **kwargs)`` to get a future of the method's result."""

    def __init__(self, call: Callable[[str, tuple, dict], Future], name: str) -> None:
        self._call = call
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> Future:
        return self._call(self._name, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"Actor methods run remotely: call handle.{self._name}.remote(...) and take .result() of the future.")


class ActorHandle:
    """A live actor. Backends pass a function that sends one method call and returns its future."""

    def __init__(self, name: str, call: Callable[[str, tuple, dict], Future], stop: Callable[[], None]) -> None:
        self._actor_name = name
        self._send = call
        self._stop = stop

    def __getattr__(self, method: str) -> ActorMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return ActorMethod(self._send, method)

    def terminate(self) -> None:
        """Stop the actor; its state is lost."""
        self._stop()

    def __repr__(self) -> str:
        return f"ActorHandle({self._actor_name!r})"


@runtime_checkable
class DistributedClient(Protocol):
    """Where work runs. See the module docstring; backends: ``LocalClient`` and ``RayClient``."""

    def remote(self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> Future: ...

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *, resources: ResourceConfig | None = None,
            max_retries: int | None = None, on_result: Callable[[int, Any], None] | None = None) -> list:
        """``[fn(item) for item in items]`` as one task per item, each with ``resources``.

        ``fn`` is shipped once per call. A failed task runs again up to ``max_retries`` times
        (``None``: the client's ``task_retries``); one that fails for good stops the others and its
        exception is raised. ``on_result(index, result)`` sees each result as it arrives.
        """
        ...

    def create_actor(self, cls: type, *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> ActorHandle: ...

    def submit(self, request: JobRequest, *, start: bool = True) -> JobHandle:
        """Place ``request`` and start it; with ``start=False`` it holds its place (PENDING) until ``job.start(env)``."""
        ...

    def check_fits(self, resources: ResourceConfig | None, *, what: str = "this request") -> None:
        """Raise :class:`UnschedulableError` if no node can ever provide ``resources``."""
        ...

    def shutdown(self) -> None: ...


def read_whole_log(read_log: Callable[[int], bytes]) -> str:
    """A job's whole output from its ``read_log(offset)``, which returns bounded chunks (``JobHandle.logs``)."""
    chunks, offset = [], 0
    while chunk := read_log(offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def describe_request(resources: ResourceConfig) -> str:
    """``"64 CPUs, 4g RAM"`` / ``"1 CPU, 16g RAM, 8 x H100 GPU"`` / ``"1 CPU, 4g RAM, trainer: 1"``: what a
    user asked for, in words."""
    parts = [f"{resources.cpu:g} CPU{'s' if resources.cpu != 1 else ''}", f"{resources.ram} RAM"]
    device = resources.device
    if device.kind == "gpu":
        parts.append(f"{device.count} x {device.variant} GPU")
    elif device.kind == "tpu":
        parts.append(f"TPU {device.type} x {device.slice_count} slice(s)")
    parts.extend(f"{name}: {amount:g}" for name, amount in resources.custom)
    return ", ".join(parts)
