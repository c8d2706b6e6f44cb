"""Where a step's function runs: wherever the run's fray client puts it.

The runner owns everything around the call (lease, ``.executor_info``, status files, artifact)
and does it the same way for every client; the executor sends the call with
:meth:`DistributedClient.remote` and watches the lease and the run's stop signal while it waits.
So the files on disk, caching and the lease protocol do not depend on where the work ran, and a
driver killed mid-run leaves stale leases a rerun takes over at once.

* Before sending, it checks that the client can ever hold the step's ``resources``, failing fast
  with a message naming the step.
* The step's context carries the runner's lease-lost and stop signals. Where the function runs
  in this process (fray's thread and inline clients; the default) it sees them, so
  ``ctx.check_lease()`` raises at once; a copy sent to another process carries signals that never
  fire there.
* If the lease is lost or the run is interrupted, the executor cancels the call (a Ray task, a
  call still queued for a worker process). A call the client cannot cancel, a function already
  running in a thread of this process, is waited for: it sees the signal itself.
* A client that would run the function in a thread of this process anyway (fray's thread and
  inline clients) is not asked to: the runner's thread calls it itself, in a fresh
  :mod:`contextvars` context as the client would, since it would only wait for it, and could
  neither cancel it. A graph of thousands of small steps then hands no call from thread to thread.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from fray.cluster import DistributedClient
from iris.attempt_log import AttemptLog
from rigging.lease import LeaseLostError

from marin.execution.running.step_context import RunCancelled, StepContext
from marin.execution.running.step_output import captured_into
from marin.execution.step_spec import CALL_CONTEXT, CALL_NO_ARGS, StepSpec

# How often a waiting runner thread looks at its lease and at Ctrl-C while a step runs.
_WATCH_INTERVAL_S = 0.5


@dataclass(frozen=True)
class StepCall:
    """One call of a step's function: what it gets, and the runner's signals to stop.

    ``attempt_log`` receives the function's output (for executors that do not keep attempt logs
    themselves); ``previous_job`` is the iris job a RUNNING status recorded, which an executor that
    runs steps as jobs adopts while it still runs; ``placed(**fields)`` is how such an executor
    tells the runner where the step now runs (``job``, ``attempt``, ...), for its status record.
    ``execution`` is the step's fenced execution (:mod:`marin.execution.ownership.step_ownership`): the
    function writes into its staging folder, ``work_path``, never into ``output_path`` itself.
    """

    spec: StepSpec
    output_path: str
    dep_output_paths: Mapping[str, str]
    lease_lost: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    attempt_log: AttemptLog | None = None
    previous_job: str | None = None
    placed: Callable[..., None] | None = None
    execution: Any = None  # an Execution; None only for calls made outside a runner

    @property
    def work_path(self) -> str:
        return self.execution.work_path if self.execution is not None else self.output_path


class StepExecutor(Protocol):
    #: Whether the executor keeps each attempt's output in the step's ``.attempts/`` itself (iris
    #: does); otherwise the runner opens the attempt and passes it in ``StepCall.attempt_log``.
    keeps_attempt_logs: bool
    #: Whether the step's execution commits its own output (an iris job does, so that a job that
    #: outlives its runner still records its result); otherwise the runner commits what ``run`` returns.
    commits_itself: bool

    def run(self, call: StepCall) -> Any:
        """Call the step's function (blocking) and return its result; raise what it raises."""
        ...

    def live_job(self, output_path: str, status: Any) -> str | None:
        """The job of an earlier runner that still runs the step (as its status record names it), to adopt."""
        ...

    def end_execution(self, output_path: str, record: Any) -> None:
        """End, within a bound, what the execution ``record`` names still runs on the engine, once it
        is fenced off (its replicas' own processes are ended from their heartbeats by the caller:
        :mod:`marin.execution.ownership.ending_executions`)."""
        ...


def call_step_function(
    spec: StepSpec,
    output_path: str,
    dep_output_paths: Mapping[str, str],
    lease_lost: threading.Event | None = None,
    cancelled: threading.Event | None = None,
) -> Any:
    """Call ``spec.fn`` according to its signature (no arguments, a StepContext, or the output path)."""
    style = spec.call_style
    if style == CALL_NO_ARGS:
        return spec.fn()
    if style == CALL_CONTEXT:
        context = StepContext(
            output_path,
            spec,
            dict(dep_output_paths),
            lease_lost if lease_lost is not None else threading.Event(),
            cancelled if cancelled is not None else threading.Event(),
        )
        return spec.fn(context)
    return spec.fn(output_path)


class _RunnerSignals:
    """The runner's lease-lost and stop events, as sent with a call: live in this process; a copy
    pickled for another process gets fresh events that never fire (the runner cancels the call instead)."""

    def __init__(self, lease_lost: threading.Event | None = None, cancelled: threading.Event | None = None) -> None:
        self.lease_lost = lease_lost
        self.cancelled = cancelled

    def __reduce__(self) -> tuple:
        return (_RunnerSignals, ())


def _call_with_signals(spec: StepSpec, output_path: str, dep_output_paths: Mapping[str, str], signals: _RunnerSignals,
                       attempt_log: AttemptLog | None = None) -> Any:
    with captured_into(attempt_log):
        return call_step_function(spec, output_path, dep_output_paths, signals.lease_lost, signals.cancelled)


def _from_the_call(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from the step's call down: the client's frames above it (futures, threads) say nothing
    about the step. Unchanged when the call ran elsewhere."""
    start = tb
    while start is not None and start.tb_frame.f_code is not _call_with_signals.__code__:
        start = start.tb_next
    return start or tb


class ClientStepExecutor:
    """Runs each step as a remote function of ``client`` with the step's ``resources``."""

    keeps_attempt_logs = False
    commits_itself = False

    def __init__(self, client: DistributedClient) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"ClientStepExecutor({self.client!r})"

    @property
    def calls_in_this_process(self) -> bool:
        """Whether a step's function runs in a thread of this process (fray's thread and inline clients)."""
        return getattr(self.client, "calls_in_this_process", False)

    def live_job(self, output_path: str, status: Any) -> str | None:
        return None  # a call dies with the runner that made it: there is never one to adopt

    def end_execution(self, output_path: str, record: Any) -> None:
        return None  # likewise: nothing of an execution outlives the call that ran it

    def run(self, call: StepCall) -> Any:
        spec = call.spec
        # Fail now, with the step's name, rather than queue work no node can ever take.
        self.client.check_fits(spec.resources, what=f"Step {spec.name!r}")
        signals = _RunnerSignals(call.lease_lost, call.cancelled)
        arguments = (spec, call.work_path, dict(call.dep_output_paths), signals, call.attempt_log)
        try:
            if self.calls_in_this_process:
                return contextvars.Context().run(_call_with_signals, *arguments)
            return self._wait(call, self.client.remote(_call_with_signals, *arguments, resources=spec.resources))
        except BaseException as error:
            raise error.with_traceback(_from_the_call(error.__traceback__))

    def _wait(self, call: StepCall, future: cf.Future) -> Any:
        while not future.done():
            cf.wait([future], timeout=_WATCH_INTERVAL_S)
            if future.done() or not (call.cancelled.is_set() or call.lease_lost.is_set()):
                continue
            if not future.cancel():
                break  # running in this process, where the function sees the signal: wait for it to stop
            name = call.spec.name
            if call.cancelled.is_set():
                raise RunCancelled(f"The run was interrupted; step {name!r} was cancelled on {self.client!r}.")
            raise LeaseLostError(
                f"Step {name!r} lost its lease on {call.output_path}; cancelled it on {self.client!r} so two "
                "runners do not both write it."
            )
        return future.result()


def executor_for(client: DistributedClient) -> StepExecutor:
    """The executor that runs steps on ``client``."""
    return ClientStepExecutor(client)
