"""``python -m marin.execution.step_job CALL_URL``: one replica of a step run as an iris job.

The runner (:mod:`marin.execution.iris_steps`) writes the call, ``(spec, output path, dependency
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
* The lease is the runner's (it heartbeats while the job runs), so ``ctx.lost_lease`` never fires
  here; a runner that loses its lease stops the job.

Only replica 0 writes the result the runner records (multi-host steps compute it on every
process; the runner writes every record of the step). Exit status: 0 when the function returned,
75 when it stopped for SIGTERM, 130 for Ctrl-C, 1 when it raised (the traceback is in the log).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback

import cloudpickle
from iris.spec import PREEMPTED_EXIT_CODE
from rigging import filesystem as fsx
from rigging.log import get_logger, setup_logging

from marin.execution.interrupts import Interrupt, RunInterruption
from marin.execution.step_executor import call_step_function

logger = get_logger("marin.execution.step_job")

CALL_FILE = "step-call.pkl"
RESULT_FILE = "step-result.pkl"
CTRL_C_EXIT_CODE = 130
SAME_NOTICE_S = 10.0


def result_url(call_url: str) -> str:
    """Where replica 0 leaves the function's result: beside the call."""
    return call_url.rsplit("/", 1)[0] + "/" + RESULT_FILE


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
        print("usage: python -m marin.execution.step_job CALL_URL", file=sys.stderr)
        return 2
    setup_logging()
    call_url = argv[0]
    with fsx.open_url(call_url, "rb") as handle:
        spec, output_path, dep_paths = cloudpickle.load(handle)
    replica = int(os.environ.get("IRIS_REPLICA_INDEX", "0"))
    stop = RunInterruption()
    _stop_on_signals(stop)
    logger.info("Step %s (replica %d of iris job %s, attempt %s): %s", spec.name, replica,
                os.environ.get("IRIS_JOB_ID", "?"), os.environ.get("IRIS_ATTEMPT", "?"), output_path)
    # The function runs in a thread, as in the runner, so this (main) thread keeps the signals: a
    # library the step uses (the trainer) installs no handler of its own off the main thread, and
    # sees the stop through the step's context instead.
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["result"] = call_step_function(spec, output_path, dep_paths, threading.Event(), stop)
        except BaseException as exc:  # noqa: BLE001 - reported through the exit status below
            outcome["error"] = exc
            outcome["traceback"] = traceback.format_exc()

    worker = threading.Thread(target=work, name=f"step {spec.name}", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)  # short waits, so signal handlers run promptly
    if "error" in outcome:
        print(outcome["traceback"], file=sys.stderr, end="")
        if stop.interrupt is Interrupt.SIGTERM:
            logger.warning("Step %s stopped for SIGTERM; exiting %d so it is run again", spec.name, PREEMPTED_EXIT_CODE)
            return PREEMPTED_EXIT_CODE
        return CTRL_C_EXIT_CODE if stop.interrupt is Interrupt.CTRL_C else 1
    if replica == 0:
        fsx.atomic_write(result_url(call_url), cloudpickle.dumps(outcome["result"]))
    logger.info("Step %s finished", spec.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
