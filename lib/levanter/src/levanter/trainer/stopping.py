"""Asking a training run to stop between steps, and saying how.

Whoever asks chooses one of two ways, because they need opposite things:

* ``PREEMPT``: the machine is going away (SIGTERM) or the user wants the run to end (Ctrl-C).
  The current step finishes, its state is checkpointed, and :class:`TrainingPreempted` is raised;
  running the same command again resumes from that checkpoint.
* ``ABANDON``: this process may no longer write its output folder (for example its lease was
  taken over: another process may be writing there now). Training stops at once and writes
  nothing more, no checkpoint, no metrics line, no export, and :class:`TrainingAbandoned` is raised.

The trainer polls its *stop sources* at every step boundary. A source is any callable returning a
:class:`StopRequest` or None, so callers plug in their own conditions (an engine's lease, a
scheduler's notice) without the trainer knowing who they are. :class:`StopSignal` is a ready-made
source that another thread or a signal handler sets.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from levanter.errors import LevanterError


class StopAction(enum.Enum):
    PREEMPT = "preempt"  # checkpoint, then stop: the run resumes later
    ABANDON = "abandon"  # stop now and write nothing: the output is no longer ours


@dataclass(frozen=True)
class StopRequest:
    action: StopAction
    reason: str  # who asked and why, for the log and the exception: "SIGTERM (preemption notice)"


StopSource = Callable[[], "StopRequest | None"]


class TrainingPreempted(LevanterError, RuntimeError):
    """The run was asked to stop (SIGTERM, Ctrl-C, ...); the state was checkpointed and the run
    stopped. Running the same command again resumes from that checkpoint."""


class TrainingAbandoned(LevanterError, RuntimeError):
    """The run was told its output is no longer its own; it stopped without writing anything more."""


class StopSignal:
    """A stop source that is set from elsewhere: another thread, or a signal handler.

    It holds the first request, except that ``ABANDON`` replaces a pending ``PREEMPT``: once
    writing is unsafe, a later preemption must not bring the checkpoint back. Setting it is a
    single attribute assignment, so it is safe inside a signal handler (a lock there could deadlock
    with the interrupted code).
    """

    def __init__(self) -> None:
        self._request: StopRequest | None = None

    def request(self, action: StopAction, reason: str) -> None:
        current = self._request
        if current is None or (current.action is StopAction.PREEMPT and action is StopAction.ABANDON):
            self._request = StopRequest(action, reason)

    def __call__(self) -> StopRequest | None:
        return self._request


def first_stop_request(sources: Iterable[StopSource]) -> StopRequest | None:
    """The most urgent request among ``sources`` (any ``ABANDON`` before any ``PREEMPT``), or None."""
    requests = [request for request in (source() for source in sources) if request is not None]
    for request in requests:
        if request.action is StopAction.ABANDON:
            return request
    return requests[0] if requests else None
