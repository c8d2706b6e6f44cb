"""Where a step's function runs: in a thread of the runner, or on a cluster through a fray client.

The runner owns everything around the call (lease, ``.executor_info``, status files, artifact)
and does it the same way for every backend; an executor only calls the step's function and hands
back its result. So the files on disk, caching and the lease protocol do not depend on where the
work ran, and a driver killed mid-run leaves stale leases a rerun takes over at once.

* :class:`InProcessStepExecutor` (the default with a thread-based ``LocalClient``): calls the
  function in the runner's worker thread; ``ctx.check_lease()`` sees a lost lease or Ctrl-C at once.
* :class:`ClientStepExecutor` (any other client, e.g. Ray): checks that the cluster can ever hold
  the step's ``resources`` (failing fast with a message naming the step otherwise), sends the call
  with :meth:`DistributedClient.remote`, and waits. If the lease is lost or the run is interrupted
  it cancels the remote call; there ``ctx.check_lease()`` never raises, the cancellation stops it.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fray.cluster import DistributedClient, LocalClient
from rigging.lease import LeaseLostError

from marin.execution.step_context import RunCancelled, StepContext
from marin.execution.step_spec import CALL_CONTEXT, CALL_NO_ARGS, StepSpec

# How often a waiting runner thread looks at its lease and at Ctrl-C while a remote step runs.
_WATCH_INTERVAL_S = 0.5


@dataclass(frozen=True)
class StepCall:
    """One call of a step's function: what it gets, and the runner's signals to stop."""

    spec: StepSpec
    output_path: str
    dep_output_paths: Mapping[str, str]
    lease_lost: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)


class StepExecutor(Protocol):
    def run(self, call: StepCall) -> Any:
        """Call the step's function (blocking) and return its result; raise what it raises."""
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


class InProcessStepExecutor:
    """Runs the step in the calling thread: the engine's behaviour without a cluster."""

    def run(self, call: StepCall) -> Any:
        return call_step_function(call.spec, call.output_path, call.dep_output_paths, call.lease_lost, call.cancelled)

    def __repr__(self) -> str:
        return "InProcessStepExecutor()"


class ClientStepExecutor:
    """Runs each step as a remote function of ``client`` with the step's ``resources``."""

    def __init__(self, client: DistributedClient) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"ClientStepExecutor({self.client!r})"

    def run(self, call: StepCall) -> Any:
        spec = call.spec
        # Fail now, with the step's name, rather than queue work no node can ever take.
        self.client.check_fits(spec.resources, what=f"Step {spec.name!r}")
        future = self.client.remote(
            call_step_function, spec, call.output_path, dict(call.dep_output_paths), resources=spec.resources
        )
        while True:
            try:
                return future.result(timeout=_WATCH_INTERVAL_S)
            except cf.TimeoutError:
                pass
            if call.cancelled.is_set():
                future.cancel()
                raise RunCancelled(f"The run was interrupted; step {spec.name!r} was cancelled on {self.client!r}.")
            if call.lease_lost.is_set():
                future.cancel()
                raise LeaseLostError(
                    f"Step {spec.name!r} lost its lease on {call.output_path}; cancelled it on {self.client!r} so two "
                    "runners do not both write it."
                )


def executor_for(client: DistributedClient) -> StepExecutor:
    """In-process for a thread-based local client (today's behaviour); through the client otherwise."""
    if isinstance(client, LocalClient) and not client.processes:
        return InProcessStepExecutor()
    return ClientStepExecutor(client)
