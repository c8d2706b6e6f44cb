"""``python -m marin.execution.running.step_job CALL_URL``: one replica of a step run as an iris job.

The runner (:mod:`marin.execution.running.iris_steps`) writes the call, ``(spec, output path, dependency
paths)`` pickled with cloudpickle, into the step's folder, and iris starts this module once per
replica, wherever its engine places it. It calls the step's function as the runner would in a
thread (it runs in a thread here too, so the signals stay with this module), with two differences
that make a preempted step round-trip:

* SIGTERM (a preemption, ``iris job stop``, a Slurm time-limit warning) and Ctrl-C set the step's
  stop signal, so a training step checkpoints and stops; the process then exits with
  :data:`iris.PREEMPTED_EXIT_CODE` (75) after SIGTERM, and iris runs it again within the step's
  preemption budget, resuming from the checkpoint. A second signal exits at once, with the same
  code, unless it comes within :data:`SAME_NOTICE_S` of the first: a scheduler that signals every
  process of a job (Slurm preempting, or at a time limit) reaches this one twice, directly and
  through the batch script, and that is one notice, not an order to stop without a checkpoint.
* The replica belongs to one fenced execution of the step (:mod:`marin.execution.ownership.step_ownership`):
  it writes into that execution's staging folder, heartbeats, and checks the fence every
  heartbeat. Once another execution owns the step (or the runner ended this one), the step's
  ``ctx.lost_lease`` fires: it stops, commits nothing, and the process exits with
  :data:`iris.FENCED_OFF_EXIT_CODE` (77), which iris never retries. A function that does not
  return within :data:`FENCED_OFF_GRACE_S` of the fence is not waited for: the process exits at
  once, so a fenced-off execution stops writing even where nobody can signal it.
* Each attempt starts from a clean staging folder: before the function runs again after a failed
  or preempted attempt, replica 0 deletes what that attempt left except its resumable state
  (:func:`marin.execution.ownership.resumable_state.keep_only_resumable`: checkpoints, finished token-cache
  shards, what the step declared), and the other replicas wait for it to have done so.

Replica 0 commits: it leaves the function's result beside the call for the runner, then moves
the staged output into the step folder and records SUCCESS, so a job that outlives its runner
still records its result (multi-host steps compute the result on every process). Exit status: 0
when the function returned (and, on replica 0, its output was committed), 75 when it stopped for
SIGTERM, 130 for Ctrl-C, 77 when fenced off, 1 when it raised.

A planned stop ends the replica's output in one line naming the reason: the error the step raised
on purpose to stop (after SIGTERM or Ctrl-C: ``RunCancelled``, ``TrainingPreempted``, any error of
the project's own kind, whose message says where it got, e.g. the checkpoint it saved), or the
fence it lost. Only a real crash prints a traceback, also when it happens while stopping.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle
from iris.spec import FENCED_OFF_EXIT_CODE, PREEMPTED_EXIT_CODE
from rigging import filesystem as fsx
from rigging.fencing import FencedOff
from rigging.log import get_logger, setup_logging

from marin.execution.ownership.interrupts import Interrupt, RunInterruption
from marin.execution.ownership.resumable_state import keep_only_resumable
from marin.execution.running.step_executor import call_step_function
from marin.execution.records.step_failures import is_explained_error
from marin.execution.ownership.step_ownership import EXECUTIONS_FOLDER, Execution, ReplicaWatch, relocated
from marin.execution.step_spec import StepSpec

logger = get_logger("marin.execution.running.step_job")

CTRL_C_EXIT_CODE = 130
SAME_NOTICE_S = 10.0
# How long a fenced-off replica's function gets to return before the process exits without it.
FENCED_OFF_GRACE_S = 5.0
# How long a replica other than 0 waits for replica 0 to clean the staging folder for a new attempt.
CLEAN_START_WAIT_S = 120.0


@dataclass(frozen=True)
class StepJobCall:
    """What the runner hands a step's replicas: the step, where it writes, and the execution it is part of."""

    spec: StepSpec
    output_path: str
    dep_output_paths: Mapping[str, str]
    execution: dict[str, Any]  # Execution.to_json()
    prefix: str | None
    heartbeat_s: float


def call_url(output_path: str, generation: int) -> str:
    """Where the runner writes the call of execution ``generation``."""
    return fsx.join(output_path, EXECUTIONS_FOLDER, f"g{generation}-call.pkl")


def result_url(output_path: str, generation: int) -> str:
    """Where replica 0 leaves the function's result for the runner: beside the call."""
    return fsx.join(output_path, EXECUTIONS_FOLDER, f"g{generation}-result.pkl")


# How a replica stopped by a signal names the reason, and what its exit code makes iris do.
_STOPPED_BY = {Interrupt.SIGTERM: "preempted by SIGTERM", Interrupt.CTRL_C: "interrupted (Ctrl-C)"}
_AFTER_EXIT = {Interrupt.SIGTERM: ": iris runs it again while its preemption budget allows", Interrupt.CTRL_C: ""}


def _stop_exit_code(interrupt: Interrupt | None) -> int:
    """The exit status of a replica whose function raised, by what asked it to stop (nothing: a crash)."""
    if interrupt is Interrupt.SIGTERM:
        return PREEMPTED_EXIT_CODE
    return CTRL_C_EXIT_CODE if interrupt is Interrupt.CTRL_C else 1


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _stop_on_signals(stop: RunInterruption) -> None:
    interrupts = {signal.SIGTERM: Interrupt.SIGTERM, signal.SIGINT: Interrupt.CTRL_C}
    first_at: list[float] = []

    def on_signal(signum: int, frame: object) -> None:
        interrupt = interrupts[signal.Signals(signum)]
        if stop.is_set() and time.monotonic() - first_at[0] < SAME_NOTICE_S:
            return  # the same notice, by another path
        if stop.is_set():
            logger.error("second %s: exiting now, without waiting for the step", interrupt.value)
            logging.shutdown()
            os._exit(PREEMPTED_EXIT_CODE if interrupt is Interrupt.SIGTERM else CTRL_C_EXIT_CODE)
        logger.warning("%s: asking the step to save what lets a rerun resume, and stop", interrupt.value)
        first_at.append(time.monotonic())
        stop.interrupt_with(interrupt)

    for signum in interrupts:
        signal.signal(signum, on_signal)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m marin.execution.running.step_job CALL_URL", file=sys.stderr)
        return 2
    setup_logging()
    with fsx.open_url(argv[0], "rb") as handle:
        call: StepJobCall = cloudpickle.load(handle)
    spec, execution = call.spec, Execution.from_json(call.execution)
    replica = int(os.environ.get("IRIS_REPLICA_INDEX", "0"))
    stop = RunInterruption()
    _stop_on_signals(stop)
    fenced_off = threading.Event()
    logger.info("Step %s (replica %d of iris job %s, attempt %s, execution g%d): %s", spec.name, replica,
                os.environ.get("IRIS_JOB_ID", "?"), os.environ.get("IRIS_ATTEMPT", "?"), execution.generation, call.output_path)
    with ReplicaWatch(execution, replica, call.heartbeat_s, lambda reason: fenced_off.set()) as watch:
        if watch.fenced_off is not None:
            logger.error("Step %s: not started, execution g%d is fenced off: %s", spec.name, execution.generation, watch.fenced_off)
            return FENCED_OFF_EXIT_CODE
        attempt = int(os.environ.get("IRIS_ATTEMPT", "1"))
        if attempt > 1 and not _start_clean(call, execution, replica, attempt):
            return 1
        return _run_replica(call, execution, replica, stop, fenced_off, watch)


def _start_clean(call: StepJobCall, execution: Execution, replica: int, attempt: int) -> bool:
    """Before attempt ``attempt`` (> 1) runs the function: what the attempts before it left in the
    staging folder goes, but for its resumable state (see the module docstring). False when replica
    0 never said it was done."""
    done = fsx.join(call.output_path, EXECUTIONS_FOLDER, f"g{execution.generation}-attempt-{attempt}-clean")
    if replica == 0:
        removed = keep_only_resumable(execution.work_path)
        if removed:
            logger.info("Step %s: attempt %d starts from a clean staging folder; removed %d file(s) the attempt before "
                        "left (kept its resumable state)", call.spec.name, attempt, len(removed))
        fsx.atomic_write(done, "")
        return True
    deadline = time.monotonic() + CLEAN_START_WAIT_S
    while not fsx.exists(done):
        if time.monotonic() >= deadline:
            logger.error("Step %s: replica 0 did not clean the staging folder for attempt %d within %.0f s", call.spec.name,
                         attempt, CLEAN_START_WAIT_S)
            return False
        time.sleep(0.2)
    return True


def _run_replica(call: StepJobCall, execution: Execution, replica: int, stop: RunInterruption, fenced_off: threading.Event,
                 watch: ReplicaWatch) -> int:
    spec = call.spec
    # The function runs in a thread, as in the runner, so this (main) thread keeps the signals: a
    # library the step uses (the trainer) installs no handler of its own off the main thread, and
    # sees the stop through the step's context instead.
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["result"] = call_step_function(spec, execution.work_path, call.dep_output_paths, fenced_off, stop)
        except BaseException as exc:  # noqa: BLE001 - reported through the exit status below
            outcome["error"] = exc
            outcome["traceback"] = traceback.format_exc()

    worker = threading.Thread(target=work, name=f"step {spec.name}", daemon=True)
    worker.start()
    fenced_at: float | None = None
    while worker.is_alive():
        worker.join(0.2)  # short waits, so signal handlers run promptly
        if fenced_off.is_set():
            fenced_at = fenced_at or time.monotonic()
            if time.monotonic() - fenced_at > FENCED_OFF_GRACE_S:
                logger.error("Step %s: execution g%d was fenced off and its function did not stop within %.0f s; exiting "
                             "now (exit %d), its output in %s not committed", spec.name, execution.generation,
                             FENCED_OFF_GRACE_S, FENCED_OFF_EXIT_CODE, execution.work_path)
                logging.shutdown()
                os._exit(FENCED_OFF_EXIT_CODE)
    if fenced_off.is_set():
        logger.error("Step %s stopped: execution g%d was fenced off (another execution owns the step now); its output "
                     "in %s is not committed. Exit %d: iris does not run it again", spec.name, execution.generation,
                     execution.work_path, FENCED_OFF_EXIT_CODE)
        return FENCED_OFF_EXIT_CODE
    if "error" in outcome:
        error = outcome["error"]
        code = _stop_exit_code(stop.interrupt)
        if stop.interrupt is not None and is_explained_error(error):
            # A planned stop: the step raised on purpose (RunCancelled, TrainingPreempted...) because
            # it was asked to stop, and its message says where it got. A traceback here would make a
            # preempted attempt's log read like a crash.
            logger.warning("Step %s stopped: %s; %s: %s Exit %d%s", spec.name, _STOPPED_BY[stop.interrupt],
                           type(error).__name__, _one_line(error), code, _AFTER_EXIT[stop.interrupt])
            return code
        print(outcome["traceback"], file=sys.stderr, end="")
        if stop.interrupt is not None:
            logger.warning("Step %s crashed while stopping (%s). Exit %d%s", spec.name, _STOPPED_BY[stop.interrupt], code,
                           _AFTER_EXIT[stop.interrupt])
        return code
    watch.finished()
    if replica == 0:
        # Every replica writes its share of a multi-host step's output: commit once all have.
        waiting = watch.wait_for_the_others(int(os.environ.get("IRIS_NUM_REPLICAS", "1")),
                                            lambda: fenced_off.is_set() or stop.interrupt is not None)
        if fenced_off.is_set():
            return FENCED_OFF_EXIT_CODE
        if waiting is not None:
            logger.error("Step %s: execution g%d not committed: %s", spec.name, execution.generation, waiting)
            return _stop_exit_code(stop.interrupt)
        result = outcome["result"]
        fsx.atomic_write(result_url(call.output_path, execution.generation),
                         cloudpickle.dumps(relocated(result, execution.work_path, call.output_path)))
        try:
            execution.commit(result, step=spec.name, identity=spec.identity, prefix=call.prefix)
        except FencedOff as exc:
            logger.error("Step %s: execution g%d could not commit, it was fenced off: %s", spec.name, execution.generation, exc)
            return FENCED_OFF_EXIT_CODE
        except Exception as exc:
            if not is_explained_error(exc):
                raise
            logger.error("Step %s: execution g%d not committed: %s: %s", spec.name, execution.generation,
                         type(exc).__name__, _one_line(exc))
            return 1
        logger.info("Step %s finished; execution g%d committed its output", spec.name, execution.generation)
    else:
        logger.info("Step %s finished", spec.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
