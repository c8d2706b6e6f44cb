"""One attempt at one step: lease, then status, then result, written the same on every backend.

For a step the plan says to run, :func:`attempt_step`:

1. takes the step's lease, waiting while another runner holds it (a SUCCESS for this identity
   written meanwhile makes the step cached; an interrupt ends the wait);
2. reads the status again, now that no one else can write it: a folder holding another identity's
   output is refused and nothing is written there; a SUCCESS is cached; a FAILED that another
   runner wrote during this run is not tried again;
3. deletes the temporary files a killed earlier attempt left (:func:`remove_orphan_temporaries`);
4. writes ``.executor_info`` and RUNNING, calls the step function through the run's
   :class:`~marin.execution.step_executor.StepExecutor`, saves ``.artifact.json``, confirms the
   lease against the lock file itself, and writes SUCCESS last, so a reader who sees SUCCESS can
   trust the output and the artifact are complete;
5. on any failure writes FAILED with the error (unless the lease was lost: the folder is then
   another runner's) and logs it (:mod:`marin.execution.step_failures`).

The lease is released whatever happens. :func:`record_dep_failed` is the short form for a step
that will not run because a dependency failed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from iris.attempt_log import AttemptLog, AttemptOutcome
from rigging import filesystem as fsx
from rigging.lease import Lease
from rigging.log import get_logger

from marin.execution.artifact import current_provenance, save_artifact
from marin.execution.executor_files import (
    INFO_FILE,
    LOCK_FILE,
    STATUS_DEP_FAILED,
    STATUS_FAILED,
    STATUS_FILE,
    STATUS_RUNNING,
    STATUS_SUCCESS,
    StatusRecord,
    read_status,
    step_location,
    write_info,
    write_status,
)
from marin.execution.interrupts import Interrupt, RunInterruption
from marin.execution.output_reuse import OutputPathConflict, check_recorded_identity
from marin.execution.run_report import Outcome, StepOutcome
from marin.execution.step_executor import StepCall, StepExecutor
from marin.execution.step_failures import log_step_failure
from marin.execution.step_spec import StepSpec

# The runner's log lines keep one logger name however its code is split, so log filters keep working.
logger = get_logger("marin.execution.step_runner")


@dataclass(frozen=True)
class RunSession:
    """What every step attempt of one run shares."""

    prefix: str
    runner_id: str
    started_at: float  # time.time() when the run started: FAILED records newer than this are this run's
    executor: StepExecutor
    cancelled: RunInterruption
    lease_ttl_s: float
    heartbeat_s: float | None
    poll_s: float

    def lease(self, spec: StepSpec, output_path: str) -> Lease:
        return Lease(
            fsx.join(output_path, LOCK_FILE),
            holder_id=f"{self.runner_id}-{spec.short_hash}",
            ttl_s=self.lease_ttl_s,
            heartbeat_s=self.heartbeat_s,
        )

    def write_status(self, spec: StepSpec, output_path: str, status: str, *, error: str | None = None,
                     attempt: int | None = None, job: str | None = None) -> StatusRecord:
        code = spec.code_fingerprint
        return write_status(
            output_path, status, holder=self.runner_id, error=error, identity=spec.identity, code=code.digest if code else None,
            attempt=attempt, job=job,
        )


def attempt_step(session: RunSession, spec: StepSpec, output_path: str, dep_paths: Mapping[str, str]) -> StepOutcome:
    """Run ``spec`` under its lease and record what happened (see the module docstring)."""
    started = time.monotonic()

    def outcome(kind: Outcome, error: str | None = None, result: Any = None) -> StepOutcome:
        return StepOutcome(spec.name, spec.identity, output_path, kind, error, time.monotonic() - started, result)

    try:
        fsx.makedirs(output_path)
        lease = session.lease(spec, output_path)
        cached_meanwhile = _acquire(session, lease, spec, output_path)
    except Exception as exc:
        logger.exception("Step %s could not start: %s", spec.name, output_path)
        return outcome(Outcome.FAILED, f"{type(exc).__name__}: {exc}")
    if cached_meanwhile is not None:
        return outcome(*cached_meanwhile)

    attempt_log: AttemptLog | None = None
    running: dict[str, Any] = {}
    try:
        status = read_status(output_path)
        try:
            # Planned before the lease was ours: what another runner wrote since is checked again.
            check_recorded_identity(spec, output_path, status)
        except OutputPathConflict as exc:
            logger.error("Step %s not run: %s", spec.name, exc)
            return outcome(Outcome.FAILED, str(exc))  # the folder is another step's: write nothing there
        if status is not None and status.status == STATUS_SUCCESS:
            return outcome(Outcome.CACHED)
        if status is not None and status.status == STATUS_FAILED and status.time >= session.started_at and status.holder != session.runner_id:
            # Another runner tried it while we waited; running it again now would double the work.
            return outcome(Outcome.FAILED, f"failed in another runner during this run: {status.error}")
        _clean_up_orphans(spec, output_path)
        logger.info("Step %s started: %s", spec.name, output_path)
        write_info(output_path, step_info(spec, output_path, dep_paths, session.prefix))
        # A job an earlier (dead) runner started may still be running the step: the executor adopts it.
        previous_job = status.job if status is not None and status.status == STATUS_RUNNING else None
        if not session.executor.keeps_attempt_logs:
            attempt_log = _begin_attempt_log(spec, output_path)
        running = {"attempt": attempt_log.attempt if attempt_log else None, "job": previous_job}
        session.write_status(spec, output_path, STATUS_RUNNING, **running)

        def placed(job_id: str, attempt: int | None) -> None:
            running.update(job=job_id, attempt=attempt)
            session.write_status(spec, output_path, STATUS_RUNNING, **running)

        call = StepCall(spec, output_path, dep_paths, lease.lost_event, session.cancelled, attempt_log, previous_job, placed)
        result = session.executor.run(call)
        lease.check()
        save_artifact(output_path, result, step=spec.name, identity=spec.identity, prefix=session.prefix)
        # Confirm with the lock file itself, not only the heartbeat thread's last look.
        lease.heartbeat()
        lease.check()
        _finish_attempt_log(attempt_log, AttemptOutcome.SUCCEEDED, "the step's function returned", 0)
        # SUCCESS goes last: a reader who sees it can trust the output and artifact are complete.
        session.write_status(spec, output_path, STATUS_SUCCESS, **running)
        return outcome(Outcome.RAN, result=result)
    except BaseException as exc:  # a step's failure must never take the runner down
        message = f"{type(exc).__name__}: {exc}"
        if lease.lost:
            message = f"lost the lease (another runner took the step over); {message}"
            _finish_attempt_log(attempt_log, AttemptOutcome.STOPPED, message, None)
        else:
            _finish_attempt_log(attempt_log, *_ending_of(session.cancelled, message))
            try:
                session.write_status(spec, output_path, STATUS_FAILED, error=message, **running)
            except Exception:
                logger.exception("Could not record FAILED for %s", output_path)
        log_step_failure(spec.name, output_path, message, exc, message_only=lease.lost or session.cancelled.is_set())
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return outcome(Outcome.FAILED, message)
    finally:
        lease.release()


def _acquire(session: RunSession, lease: Lease, spec: StepSpec, output_path: str) -> tuple[Outcome, str | None] | None:
    """Take ``lease``, waiting for another runner's; or the outcome that ends the wait without it."""
    waiting_logged = False
    while not lease.try_acquire():
        if session.cancelled.is_set():
            return Outcome.FAILED, "interrupted while waiting for another runner"
        status = read_status(output_path)
        if status is not None and status.status == STATUS_SUCCESS and status.identity == spec.identity:
            return Outcome.CACHED, None
        if not waiting_logged:
            holder = lease.read()
            logger.info(
                "Step %s is being run by another runner (%s); waiting: %s",
                spec.name,
                f"{holder.host} pid {holder.pid}" if holder else "?",
                output_path,
            )
            waiting_logged = True
        time.sleep(session.poll_s)
    return None


def record_dep_failed(session: RunSession, spec: StepSpec, output_path: str, culprits: list[str]) -> StepOutcome:
    """The outcome of a step not run because ``culprits`` (its dependencies) failed, recorded on disk
    unless another runner is working on the step right now."""
    error = f"dependency failed: {', '.join(culprits)}"
    logger.warning("Step %s not run (%s): %s", spec.name, error, output_path)
    lease = session.lease(spec, output_path)
    if lease.try_acquire():
        try:
            current = read_status(output_path)
            if current is None or current.status != STATUS_SUCCESS:
                write_info(output_path, step_info(spec, output_path, {}, session.prefix))
                session.write_status(spec, output_path, STATUS_DEP_FAILED, error=error)
        finally:
            lease.release()
    return StepOutcome(spec.name, spec.identity, output_path, Outcome.DEP_FAILED, error=error)


def step_info(spec: StepSpec, output_path: str, dep_paths: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """The ``.executor_info`` record: what ran, from which code, on which inputs, and where."""
    code = spec.code_fingerprint
    provenance = current_provenance()
    return {
        "name": spec.name,
        "identity": spec.identity,
        "short_hash": spec.short_hash,
        "version": spec.version,
        "hash_attrs": spec.identity_record["hash_attrs"],
        "fn": spec.fn_description,
        "code": code.to_json() if code else None,
        "git": {"commit": provenance.git_commit, "dirty": provenance.git_dirty},
        "deps": [
            {
                "name": dep.name,
                "identity": dep.identity,
                "output_path": dep_paths.get(dep.identity),
                # Where it lies inside the prefix: what survives moving or copying the prefix.
                "location": step_location(dep_paths[dep.identity], prefix) if dep.identity in dep_paths else None,
            }
            for dep in spec.deps
        ],
        "output_path": output_path,
        "location": step_location(output_path, prefix),
        "explicit_output_path": spec.output_path is not None,
        "resources": repr(spec.resources) if spec.resources is not None else None,
        "identity_record": spec.identity_record,
    }


def _begin_attempt_log(spec: StepSpec, output_path: str) -> AttemptLog | None:
    """A new attempt folder for a step the runner runs itself; a step runs without one if it cannot be made."""
    try:
        return AttemptLog.begin(output_path, engine="local")
    except Exception as exc:  # noqa: BLE001 - a copy of the output is never a reason to fail the step
        logger.warning("Step %s: cannot keep this attempt's output in %s: %s", spec.name, output_path, exc)
        return None


def _ending_of(cancelled: RunInterruption, message: str) -> tuple[AttemptOutcome, str, int]:
    """How a step the runner ran itself ended, in the terms of an iris attempt (outcome, reason, exit code)."""
    if cancelled.interrupt is Interrupt.SIGTERM:
        return AttemptOutcome.PREEMPTED, f"the run received SIGTERM; {message}", 75
    if cancelled.interrupt is Interrupt.CTRL_C:
        return AttemptOutcome.STOPPED, f"the run was interrupted (Ctrl-C); {message}", 130
    return AttemptOutcome.FAILED, message, 1


def _finish_attempt_log(log: AttemptLog | None, outcome: AttemptOutcome, reason: str, exit_code: int | None) -> None:
    if log is None:
        return
    try:
        log.finish(outcome, reason, (exit_code,))
    except Exception as exc:  # noqa: BLE001
        logger.warning("Could not record how attempt %d ended in %s: %s", log.attempt, log.url, exc)


def _clean_up_orphans(spec: StepSpec, output_path: str) -> None:
    try:
        removed = remove_orphan_temporaries(output_path)
        if removed:
            logger.info("Step %s: removed %d temporary file(s) a killed earlier attempt left in %s", spec.name, removed, output_path)
    except Exception as exc:  # noqa: BLE001 - housekeeping: never a reason to fail the step
        logger.warning("Step %s: could not clean up temporary files in %s: %s", spec.name, output_path, exc)


def remove_orphan_temporaries(output_path: str) -> int:
    """Delete the in-progress files of atomic writes that an earlier, dead attempt left behind.

    Called by the holder of the step's lease before the step function starts. The rule: at that
    moment every temporary file in the folder is an orphan, because the lease admits one attempt at
    a time and this attempt has written nothing yet (its own writers, zephyr shards included, start
    after this). Two kinds of temporaries are left alone: those of the lock file (this runner's
    heartbeat and competing runners' acquire attempts write them right now), and anything inside a
    subfolder that is another step's output folder (that step has its own lease and may be running).
    Deleting a temporary can never corrupt anything: at worst a writer that should not exist fails
    its final rename. One recursive listing and one batch delete keep it cheap on object stores.
    """
    files = fsx.find_files(output_path)
    control_files = (STATUS_FILE, INFO_FILE, LOCK_FILE)
    other_steps = tuple(
        folder + "/" for folder, _, name in (f.rpartition("/") for f in files) if folder and name in control_files
    )
    orphans = [
        f
        for f in files
        if fsx.is_temporary_name(f)
        and not f.rpartition("/")[2].startswith(f".{LOCK_FILE}.")
        and not f.startswith(other_steps)
    ]
    fsx.remove_files(output_path, orphans)
    return len(orphans)
