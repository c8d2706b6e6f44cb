"""One attempt at one step: lease, then status, then result, written the same on every backend.

For a step the plan says to run, :func:`attempt_step`:

1. takes the step's lease, waiting while another runner holds it (a SUCCESS for this identity
   written meanwhile makes the step cached; an interrupt ends the wait), or, when asked not to
   wait, answering :class:`HeldElsewhere` at once so the run can take other work meanwhile; a
   lease whose runner died is taken over, which is how a straggler's step is retaken;
2. reads the status again, now that no other runner can write it: a folder holding another
   identity's output is refused and nothing is written there; a SUCCESS is cached (so is a commit
   cut short, once it is finished); a FAILED that another runner wrote during this run is not
   tried again;
3. looks for an earlier execution that outlived its runner: an iris job still running is adopted
   (waited for; it commits its own result), replicas still heartbeating without a supervisor are
   waited for, since they may still finish (:mod:`marin.execution.ownership.step_ownership`);
4. deletes the temporary files a killed earlier attempt left (:func:`remove_orphan_temporaries`);
5. writes ``.executor_info``, claims a new execution (the next generation of the step's fenced
   record, RUNNING, in a clean staging folder of its own), ends the execution it fenced off
   (:mod:`marin.execution.ownership.ending_executions`) and, once that one is known dead, takes over its
   resumable state (:mod:`marin.execution.ownership.resumable_state`: which is how a training step resumes
   from its checkpoints), calls the step function through the
   run's :class:`~marin.execution.running.step_executor.StepExecutor` on its staging folder, confirms the
   lease against the lock file itself, and commits: the artifact, then the move of the staged
   output into the step folder, then SUCCESS, each refused if another execution owns the step
   now. A reader who sees SUCCESS can trust the output and the artifact are complete;
6. on any failure writes FAILED with the error (unless the lease or the fence was taken over:
   the folder is then another execution's), which fences its own execution off, ends what of it
   still runs (a job's replicas whose supervisor died), and logs it (:mod:`marin.execution.records.step_failures`).

The lease is released whatever happens. :func:`record_dep_failed` is the short form for a step
that will not run because a dependency failed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from iris.attempt_log import AttemptLog, AttemptOutcome
from rigging import filesystem as fsx
from rigging.fencing import FencedOff, claim
from rigging.lease import Lease
from rigging.log import get_logger
from rigging.secrets import redact

from marin.execution.artifact import current_provenance, save_artifact
from marin.execution.ownership.ending_executions import FENCE_WAIT_S, end_replicas
from marin.execution.scheduling.engine_slots import EngineSlots
from marin.execution.records.executor_files import (
    INFO_FILE,
    LOCK_FILE,
    STATUS_DEP_FAILED,
    STATUS_FAILED,
    STATUS_FILE,
    STATUS_RUNNING,
    STATUS_SUCCESS,
    StatusRecord,
    read_status,
    status_url,
    step_location,
    write_info,
)
from marin.execution.ownership.interrupts import Interrupt, RunInterruption
from marin.execution.planning.output_reuse import OutputPathConflict, check_recorded_identity
from marin.execution.ownership.resumable_state import carry_over
from marin.execution.records.run_report import Outcome, StepOutcome
from marin.execution.running.step_executor import StepCall, StepExecutor
from marin.execution.records.step_failures import log_step_failure
from marin.execution.ownership.step_ownership import (
    EXECUTIONS_FOLDER,
    Execution,
    ReplicaHeartbeat,
    claim_execution,
    is_staging_entry,
    read_ownership,
    replica_heartbeats,
    roll_forward,
    stage_unstaged_output,
)
from marin.execution.step_spec import CALL_NO_ARGS, StepSpec

# The runner's log lines keep one logger name however its code is split, so log filters keep working.
logger = get_logger("marin.execution.step_runner")


@dataclass(frozen=True)
class HeldElsewhere:
    """Another live runner holds the step's lease: what :func:`attempt_step` answers instead of waiting."""

    holder: str  # "host pid N" of the lease's holder, as its lock file names it


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
    # How long the one who fences an execution off waits for its replicas to be known dead (they are
    # sent SIGTERM, then killed), so that a new execution can take over their resumable state.
    orphan_wait_s: float = FENCE_WAIT_S
    # How many attempts do the engine's own work at once (see engine_slots); none: no limit.
    slots: EngineSlots = field(default_factory=lambda: EngineSlots(None))

    def lease(self, spec: StepSpec, output_path: str) -> Lease:
        return Lease(
            fsx.join(output_path, LOCK_FILE),
            holder_id=f"{self.runner_id}-{spec.short_hash}",
            ttl_s=self.lease_ttl_s,
            heartbeat_s=self.heartbeat_s,
        )


def attempt_step(session: RunSession, spec: StepSpec, output_path: str, dep_paths: Mapping[str, str], *,
                 wait_for_others: bool = True) -> StepOutcome | HeldElsewhere:
    """Run ``spec`` under its lease and record what happened (see the module docstring).

    With ``wait_for_others=False`` a step whose lease another live runner holds is not waited for:
    the answer is :class:`HeldElsewhere` at once, so the caller can take other work and come back to
    it (how several runners share one sweep).
    """
    # Each fsync of a record waits for the disk with the slot given up: the wait needs no CPU, and
    # the attempts waiting at once share the filesystem's journal commits instead of queueing for one each.
    with session.slots.held(), fsx.flushing_with(session.slots.given_up):
        return _attempt(session, spec, output_path, dep_paths, wait_for_others)


def _attempt(session: RunSession, spec: StepSpec, output_path: str, dep_paths: Mapping[str, str],
             wait_for_others: bool) -> StepOutcome | HeldElsewhere:
    started = time.monotonic()

    def outcome(kind: Outcome, error: str | None = None, result: Any = None) -> StepOutcome:
        return StepOutcome(spec.name, spec.identity, output_path, kind, error, time.monotonic() - started, result,
                           first_attempt=attempt_log.attempt if attempt_log is not None else None)

    attempt_log: AttemptLog | None = None

    try:
        fsx.makedirs(output_path)
        lease = session.lease(spec, output_path)
        cached_meanwhile = _acquire(session, lease, spec, output_path, wait=wait_for_others)
    except Exception as exc:
        logger.exception("Step %s could not start: %s", spec.name, output_path)
        return outcome(Outcome.FAILED, f"{type(exc).__name__}: {exc}")
    if isinstance(cached_meanwhile, HeldElsewhere):
        return cached_meanwhile
    if cached_meanwhile is not None:
        return outcome(*cached_meanwhile)

    execution: Execution | None = None
    running: dict[str, Any] = {}
    try:
        snapshot, status = read_ownership(output_path)
        try:
            # Planned before the lease was ours: what another runner wrote since is checked again.
            check_recorded_identity(spec, output_path, status)
        except OutputPathConflict as exc:
            logger.error("Step %s not run: %s", spec.name, exc)
            return outcome(Outcome.FAILED, str(exc))  # the folder is another step's: write nothing there
        if status is not None and status.status == STATUS_RUNNING and status.committing:
            if roll_forward(output_path, snapshot, status):
                return outcome(Outcome.CACHED)
            snapshot, status = read_ownership(output_path)
        if status is not None and status.status == STATUS_SUCCESS:
            return outcome(Outcome.CACHED)
        if status is not None and status.status == STATUS_FAILED and status.time >= session.started_at and status.holder != session.runner_id:
            # Another runner tried it while we waited; running it again now would double the work.
            return outcome(Outcome.FAILED, f"failed in another runner during this run: {status.error}")
        # An execution an earlier (dead) runner started may still be running the step.
        live_job = session.executor.live_job(output_path, status) if status is not None else None
        if live_job is None and status is not None and status.status == STATUS_RUNNING:
            snapshot, status = _wait_for_replicas_of(session, spec, output_path, status)
            if status is not None and status.status == STATUS_SUCCESS:
                return outcome(Outcome.CACHED)
            if session.cancelled.is_set():
                return outcome(Outcome.FAILED, "interrupted while waiting for an earlier execution")
        _clean_up_orphans(spec, output_path)
        logger.info("Step %s started: %s", spec.name, output_path)
        write_info(output_path, step_info(spec, output_path, dep_paths, session.prefix))
        if not session.executor.keeps_attempt_logs:
            attempt_log = _begin_attempt_log(spec, output_path, getattr(session.executor, "calls_in_this_process", False))
        running = {"attempt": attempt_log.attempt if attempt_log else None, "job": live_job}
        if live_job is not None:
            execution = Execution.of_record(output_path, status)
            execution.write(holder=session.runner_id, **running)
        else:
            execution = _start_execution(session, spec, output_path, snapshot, status, running)
        if spec.call_style != CALL_NO_ARGS:  # a function given no folder writes none: none is made for it
            fsx.makedirs(execution.work_path)

        def placed(**fields: Any) -> None:
            running.update(fields)
            try:
                execution.write(**fields)
            except FencedOff:
                pass  # the execution has ended meanwhile (its job committed, or was fenced off): its record says so

        call = StepCall(spec, output_path, dep_paths, lease.lost_event, session.cancelled, attempt_log, live_job, placed, execution)
        with session.slots.given_up():  # the step's function: as many at once as the run allows
            result = session.executor.run(call)
        lease.check()
        if not session.executor.commits_itself:
            # Confirm with the lock file itself, not only the last heartbeat's look.
            lease.confirm()
            lease.check()
            result = execution.commit(result, step=spec.name, identity=spec.identity, prefix=session.prefix)
        _finish_attempt_log(attempt_log, AttemptOutcome.SUCCEEDED, "the step's function returned", 0)
        return outcome(Outcome.RAN, result=result)
    except BaseException as exc:  # a step's failure must never take the runner down
        # An error message may quote a credential (a URL with a token, a failed login): it is kept in
        # the status record and the run report, so known secret values are redacted from it.
        message = redact(f"{type(exc).__name__}: {exc}")
        superseded = lease.lost or isinstance(exc, FencedOff)
        if superseded:
            message = f"lost the lease or its fence (another execution owns the step now); {message}"
            _finish_attempt_log(attempt_log, AttemptOutcome.STOPPED, message, None)
        else:
            _finish_attempt_log(attempt_log, *_ending_of(session.cancelled, message))
            try:
                _record_failure(session, spec, output_path, execution, STATUS_FAILED, message, running)
            except FencedOff as fenced:
                logger.warning("Step %s: FAILED not recorded, another execution owns the step now (%s)", spec.name, fenced)
            except Exception:
                logger.exception("Could not record FAILED for %s", output_path)
            else:
                _end_own_execution(session, output_path, execution)
        log_step_failure(spec.name, output_path, message, exc, message_only=superseded or session.cancelled.is_set())
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return outcome(Outcome.FAILED, message)
    finally:
        lease.release()


def _status_fields(session: RunSession, spec: StepSpec) -> dict[str, Any]:
    code = spec.code_fingerprint
    return {"holder": session.runner_id, "identity": spec.identity, "code": code.digest if code else None}


def _start_execution(session: RunSession, spec: StepSpec, output_path: str, snapshot: Any, status: StatusRecord | None,
                     running: dict[str, Any]) -> Execution:
    """Claim a new execution of the step, in a clean staging folder of its own; end the one it fences
    off, and carry over what that one left that is resumable, once it is known dead."""
    for _ in range(20):
        execution = claim_execution(output_path, snapshot, {**_status_fields(session, spec), **running})
        if execution is not None:
            break
        snapshot, status = read_ownership(output_path)  # a replica of the old execution wrote meanwhile
    else:
        raise FencedOff(f"{output_path}: the step's record kept changing; could not start an execution")
    if status is None:
        return execution
    if not status.staging:
        moved = stage_unstaged_output(output_path, execution.staging)
        if moved:
            logger.info("Step %s: execution g%d continues from what an earlier run left in the step folder (%s)",
                        spec.name, execution.generation, ", ".join(moved))
        return execution
    # After the claim: a replica of the old execution that checks the fence from now on finds it
    # taken, and stops; what does not stop by itself is ended here.
    still_running = _end_execution(session, output_path, status)
    if not fsx.exists(fsx.join(output_path, status.staging)):
        return execution
    if still_running:
        logger.warning("Step %s: execution g%d starts from a clean folder; what g%d left in %s is not taken over, since "
                       "%s may still write there", spec.name, execution.generation, status.generation, status.staging,
                       ", ".join(beat.describe() for beat in still_running))
        return execution
    carried = carry_over(output_path, status.staging, execution.staging)
    if carried:
        logger.info("Step %s: execution g%d continues from the resumable state g%d left in %s: %s", spec.name,
                    execution.generation, status.generation, status.staging, ", ".join(carried))
        _clean_up_orphans(spec, execution.work_path)
    else:
        logger.info("Step %s: execution g%d starts from a clean folder (g%d left no resumable state in %s)", spec.name,
                    execution.generation, status.generation, status.staging)
    return execution


def _end_own_execution(session: RunSession, output_path: str, execution: Execution | None) -> None:
    """After this runner recorded its execution FAILED (which fences it off): end what of it still
    runs elsewhere (a job's replicas whose supervisor died), not leave it writing into its folder."""
    if execution is None or not session.executor.commits_itself:
        return  # a call in this runner has ended with the call
    try:
        _, ended = read_ownership(output_path)
        if ended is not None and ended.generation == execution.generation:
            _end_execution(session, output_path, ended)
    except Exception as exc:  # noqa: BLE001 - the replicas still stop at their next look at the fence
        logger.warning("Could not end execution g%d of %s: %s", execution.generation, output_path, exc)


def _end_execution(session: RunSession, output_path: str, record: StatusRecord) -> list[ReplicaHeartbeat]:
    """End the fenced-off execution ``record`` names: on its engine, then its replicas; those not
    known dead after the session's bounded wait."""
    try:
        session.executor.end_execution(output_path, record)
    except Exception as exc:  # noqa: BLE001 - the replicas below are still ended; what is left is logged
        logger.warning("Could not end execution g%d of %s on its engine: %s", record.generation, output_path, exc)
    return end_replicas(output_path, record.generation, wait_s=session.orphan_wait_s, sleep=session.slots.sleep)


def _wait_for_replicas_of(session: RunSession, spec: StepSpec, output_path: str, status: StatusRecord) -> tuple[Any, StatusRecord | None]:
    """Wait while replicas of the RUNNING execution the record names still heartbeat (a job whose
    runner and supervisor are gone can still finish and commit); the record as it is then. Bounded:
    a replica that stops heartbeating is waited for no longer than its heartbeat's time to live, and
    none longer than the step's time limit (when it has one), after which it is fenced off and ended."""
    announced = False
    limit = spec.resources.time_limit_s if spec.resources is not None else None
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        snapshot, now = read_ownership(output_path)
        if now is None or now.status != STATUS_RUNNING or now.generation != status.generation or session.cancelled.is_set():
            return snapshot, now
        if now.committing:
            roll_forward(output_path, snapshot, now)
            continue
        alive = [beat for beat in replica_heartbeats(output_path, now.generation) if beat.may_be_running()]
        if not alive:
            return snapshot, now
        described = ", ".join(b.describe() for b in alive)
        if deadline is not None and time.monotonic() >= deadline:
            logger.warning("Step %s: execution g%d (iris job %s: %s) still runs after the step's time limit of %.0f s; "
                           "fencing it off", spec.name, now.generation, now.job or "?", described, limit)
            return snapshot, now
        if not announced:
            logger.info("Step %s: execution g%d (iris job %s) has no runner, but %s still run(s); waiting for it to "
                        "finish instead of starting the step again%s: %s", spec.name, now.generation, now.job or "?",
                        described, f" (at most {limit:.0f} s, the step's time limit)" if limit else "", output_path)
            announced = True
        session.slots.sleep(session.poll_s)


def _record_failure(session: RunSession, spec: StepSpec, output_path: str, execution: Execution | None, status: str,
                    error: str, running: Mapping[str, Any]) -> None:
    """Record that the step's execution ended without success (a new one when none was started yet)."""
    if execution is not None:
        execution.write(status=status, error=error, **running)
        return
    for _ in range(20):
        snapshot, _ = read_ownership(output_path)
        if claim(status_url(output_path), {**_status_fields(session, spec), **running, "status": status, "error": error,
                                           "time": time.time(), "staging": None, "committing": False}, snapshot):
            return


def _acquire(session: RunSession, lease: Lease, spec: StepSpec, output_path: str, *, wait: bool = True) -> Any:
    """Take ``lease``, waiting for another runner's (unless ``wait`` is false: :class:`HeldElsewhere`
    then); or the outcome that ends the wait without it. A stale lease (its runner died) is taken
    over by ``try_acquire`` itself."""
    waiting_logged = False
    while not lease.try_acquire():
        if session.cancelled.is_set():
            return Outcome.FAILED, "interrupted while waiting for another runner"
        status = read_status(output_path)
        if status is not None and status.status == STATUS_SUCCESS and status.identity == spec.identity:
            return Outcome.CACHED, None
        if not wait or not waiting_logged:
            holder = lease.read()
            who = f"{holder.host} pid {holder.pid}" if holder else "?"
            if not wait:
                return HeldElsewhere(who)
            logger.info("Step %s is being run by another runner (%s); waiting: %s", spec.name, who, output_path)
            waiting_logged = True
        session.slots.sleep(session.poll_s)
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
                _record_failure(session, spec, output_path, None, STATUS_DEP_FAILED, error, {})
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
        "annotations": dict(spec.annotations),
        "identity_record": spec.identity_record,
    }


def _begin_attempt_log(spec: StepSpec, output_path: str, in_this_process: bool) -> AttemptLog | None:
    """A new attempt of a step the runner runs itself; a step runs without one if it cannot be made."""
    try:
        # Not fsynced: the records of the runner's own attempts only inform (no rerun counts from
        # them), so losing one to a machine crash costs a line of `marin logs`, not a decision. The
        # log appears with the step's first output: a graph of thousands of silent steps makes no
        # empty file for each. Where the function runs in this process, the attempt's folder and
        # opening record wait for its first output too: a silent step writes its one record when it
        # ends (its status record names the attempt meanwhile). A function sent to another process
        # prints there, so its attempt is opened here at once.
        return AttemptLog.begin(output_path, engine="local", durable=False, create_logs=False,
                                opening_record=not in_this_process)
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
    files = [f for f in fsx.find_files(output_path)
             if not f.startswith(f"{EXECUTIONS_FOLDER}/") and not ("/" in f and is_staging_entry(f.split("/", 1)[0]))]
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
