"""Ctrl-C and SIGTERM during a run: running steps are asked to stop, and told why.

Steps run in worker threads, and only the main thread can handle signals. So while a run is in
progress the runner's main thread turns both signals into one flag, the run's
:class:`RunInterruption` event, which every step's :class:`~marin.execution.running.step_context.StepContext`
carries as ``cancelled``:

* **Ctrl-C** (SIGINT): the user wants the run to end.
* **SIGTERM**: the machine is going away (how schedulers announce preemption).

Either way nothing new starts, and steps that look (``ctx.check_lease()`` raises,
``ctx.stop_reason()`` says which) stop; a training step checkpoints first, so a rerun resumes
there. Once the running steps have returned, the run raises KeyboardInterrupt (Ctrl-C) or
:class:`RunPreempted` (SIGTERM; it exits the process with status 75, iris's "preempted, run me
again", unless caught), so a scheduler that retries preempted work retries the run. A second
signal of either kind ends the process at once: step threads cannot be killed and the interpreter
would wait for them. Those steps stay RUNNING under the lease of a dead process, which the next run
takes over at once, as after a kill.

Only a flag, because a KeyboardInterrupt raised at an arbitrary point of the scheduling loop can
land inside ``concurrent.futures`` while it holds a future's lock, and the run then hangs for good.
Off the main thread no handler can be installed: there KeyboardInterrupt is handled where it is
raised and SIGTERM keeps its default (the process ends without a checkpoint).

Steps sent to another process by a fray client (``ClientStepExecutor``) do not see these events:
they do not cross the process boundary. The runner cancels such a step instead, so it stops
without a checkpoint of that moment and resumes from its last periodic one.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import sys
import threading
from collections.abc import Sized

from iris.spec import PREEMPTED_EXIT_CODE
from rigging.log import get_logger

logger = get_logger(__name__)


class Interrupt(enum.Enum):
    CTRL_C = "Ctrl-C"
    SIGTERM = "SIGTERM"


class RunPreempted(SystemExit):
    """The runner received SIGTERM: running steps were asked to checkpoint and stop, and did.

    A SystemExit, so that uncaught it ends the process quietly (the log already says what happened)
    with :data:`iris.PREEMPTED_EXIT_CODE` (75): the status iris, and any wrapper that follows its
    convention, counts as a preemption and retries within the preemption budget, where 143 (killed
    by SIGTERM) would read as a plain failure once a shell or launcher stood in between. Running
    again resumes from the saved checkpoints.
    """

    def __init__(self, message: str) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.message = message

    def __str__(self) -> str:
        return self.message


class RunInterruption(threading.Event):
    """The run's "stop now" event; it also remembers which interrupt set it first."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupt: Interrupt | None = None

    def interrupt_with(self, interrupt: Interrupt) -> None:
        if self.interrupt is None:
            self.interrupt = interrupt
        self.set()


def interrupt_of(event: threading.Event) -> Interrupt | None:
    """Which interrupt set ``event`` (None while it is clear); a plain Event set by other code
    counts as Ctrl-C, the stop that was there before SIGTERM was."""
    if not event.is_set():
        return None
    return getattr(event, "interrupt", None) or Interrupt.CTRL_C


_SIGNALS = {signal.SIGINT: Interrupt.CTRL_C, signal.SIGTERM: Interrupt.SIGTERM}


class RunInterrupts:
    """While a run is in progress (``with``), Ctrl-C and SIGTERM set ``stop`` instead of raising.

    ``running`` is the collection of running steps, only counted in log lines.
    """

    def __init__(self, stop: RunInterruption, running: Sized) -> None:
        self._stop = stop
        self._running = running
        self._previous: dict[int, object] = {}
        self.interrupt: Interrupt | None = None

    @property
    def interrupted(self) -> bool:
        return self.interrupt is not None

    def __enter__(self) -> "RunInterrupts":
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            if previous is not None:  # None: installed from C; it cannot be put back from Python
                signal.signal(signum, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        interrupt = _SIGNALS[signal.Signals(signum)]
        if self.interrupted:
            logger.error(
                "second %s: exiting now, without waiting for %d running step(s)", interrupt.value, len(self._running)
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signum)
        self.stop_steps(interrupt)

    def stop_steps(self, interrupt: Interrupt) -> None:
        """Ask the running steps to stop (and start nothing new), recording why."""
        self.interrupt = self.interrupt or interrupt
        self._stop.interrupt_with(interrupt)
        if interrupt is Interrupt.SIGTERM:
            logger.warning(
                "SIGTERM (preemption): asking %d running step(s) to checkpoint and stop (steps that never call "
                "ctx.check_lease() finish first; SIGTERM or Ctrl-C again to stop at once)",
                len(self._running),
            )
        else:
            logger.warning(
                "Interrupted: stopping %d running step(s) (steps that never call ctx.check_lease() finish first; "
                "Ctrl-C again to stop at once)",
                len(self._running),
            )

    def raise_if_interrupted(self) -> None:
        """After the running steps returned: end the run the way its interrupt asks."""
        if self.interrupt is Interrupt.CTRL_C:
            raise KeyboardInterrupt("the run was stopped by Ctrl-C")
        if self.interrupt is Interrupt.SIGTERM:
            message = "the run was stopped by SIGTERM (preemption); run it again to resume from the saved checkpoints"
            logger.error("Preempted: %s", message)
            raise RunPreempted(message)
