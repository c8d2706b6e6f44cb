"""Ending an execution that was fenced off: its processes stop, for certain, within a bound.

The fence (:mod:`marin.execution.ownership.step_ownership`) stops an execution from committing, not from
running: a replica whose function never looks at its context goes on writing into its staging
folder, and its CPU or its Slurm allocation stays taken. So whoever fences an execution off (a
rerun that supersedes it, the runner that ends its own execution once its job's supervisor died)
also ends its processes, after the fence is written (so none of them can commit meanwhile):

* each replica that may still run is asked to stop: SIGTERM to its process (and the group it
  leads) when it is a process of this machine, identified by pid *and* start time so a reused pid
  is never hit; ``scancel`` of its Slurm job, which its heartbeat names, from any machine;
* whatever still runs after ``grace_s`` is killed (SIGKILL; ``scancel --signal=KILL``);
* the wait is bounded by ``wait_s``: what is then still not known to have stopped is returned, and
  the caller does not take over what it left (see below).

The executor also ends what the heartbeats cannot name (a job not started yet, a supervisor):
:meth:`~marin.execution.running.step_executor.StepExecutor.end_execution`. Every engine job of an execution
carries its tag (:func:`execution_tag`: the step and the generation; on Slurm the job's comment), by
which :func:`cancel_tagged_slurm_jobs` finds and cancels those of fenced-off generations from any
machine, with nothing but the step's folder to go on. And each replica stops by
itself once it sees the fence, killing its own process if its function does not return within a
grace period (:mod:`marin.execution.running.step_job`), which covers machines nobody else can signal.

An execution is *known dead* once each replica's heartbeat says it ended, names a process of this
machine that is gone, or names a Slurm job Slurm says has ended. Only then may a later execution
take over its resumable state (:mod:`marin.execution.ownership.resumable_state`).
"""

from __future__ import annotations

import hashlib
import signal
import time
from collections.abc import Callable

from rigging.log import get_logger

from marin.execution.ownership.step_ownership import ReplicaHeartbeat, replica_heartbeats

logger = get_logger("marin.execution.step_runner")

# How long a fenced-off replica gets to stop after SIGTERM (a trainer saves a checkpoint) before it is killed.
FENCE_GRACE_S = 10.0
# How long, in all, the one who fences waits for the replicas to be known stopped.
FENCE_WAIT_S = 30.0
_POLL_S = 0.1


def known_dead(beat: ReplicaHeartbeat) -> bool:
    """Whether the replica certainly writes no more (see the module docstring)."""
    if beat.known_stopped():
        return True
    if beat.slurm_job and beat.process.alive_here() is None:
        return _slurm_job_ended(beat.slurm_job)
    return False


def end_replicas(output_path: str, generation: int, *, grace_s: float = FENCE_GRACE_S, wait_s: float = FENCE_WAIT_S,
                 sleep: Callable[[float], None] = time.sleep) -> list[ReplicaHeartbeat]:
    """Stop every replica of execution ``generation`` of the step at ``output_path`` that may still
    run: SIGTERM, then a kill after ``grace_s``; the replicas not known to be dead after ``wait_s``
    (none: the execution is known dead)."""
    running = [beat for beat in replica_heartbeats(output_path, generation) if not known_dead(beat)]
    if not running:
        return []
    logger.warning("Ending %s of execution g%d, which was fenced off: %s", ", ".join(b.describe() for b in running),
                   generation, output_path)
    for beat in running:
        _stop(beat, signal.SIGTERM)
    started = time.monotonic()
    killed = False
    while True:
        sleep(_POLL_S)
        running = [beat for beat in replica_heartbeats(output_path, generation) if not known_dead(beat)]
        elapsed = time.monotonic() - started
        if not running or elapsed >= wait_s:
            if running:
                logger.warning("Execution g%d of %s: %s not known to have stopped after %.0f s", generation, output_path,
                               ", ".join(b.describe() for b in running), elapsed)
            return running
        if not killed and elapsed >= grace_s:
            for beat in running:
                logger.warning("Killing %s of execution g%d: it did not stop within %.0f s of SIGTERM", beat.describe(),
                               generation, grace_s)
                _stop(beat, signal.SIGKILL)
            killed = True


def _stop(beat: ReplicaHeartbeat, signum: int) -> None:
    if beat.process.send_signal(signum):
        return
    if beat.slurm_job and beat.process.alive_here() is None:
        from fray.cluster.slurm_client import SlurmClient
        from fray.cluster.slurm_commands import SlurmError

        try:
            SlurmClient(check_resources=False).cancel([beat.slurm_job], kill=signum == signal.SIGKILL)
        except SlurmError as exc:
            logger.warning("Could not cancel Slurm job %s of %s: %s", beat.slurm_job, beat.describe(), exc)


def _slurm_job_ended(slurm_id: str) -> bool:
    from fray.cluster.slurm_commands import SlurmError, job_record

    try:
        record = job_record(slurm_id)
    except SlurmError:
        return False  # cannot tell now
    return record is None or record.state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                                                  "REQUEUED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING")


# -- an execution's engine jobs, by their tag -------------------------------------------------------


def execution_tag(output_path: str, generation: int | None = None) -> str:
    """The tag of the engine jobs of execution ``generation`` of the step at ``output_path``; without
    a generation, the prefix every execution's tag of that step starts with."""
    key = hashlib.sha256(output_path.rstrip("/").encode()).hexdigest()[:16]
    return f"marin-step-{key}-g" + ("" if generation is None else str(generation))


def _tag_generation(tag: str, prefix: str) -> int | None:
    rest = tag[len(prefix):]
    return int(rest) if rest.isdigit() else None


def cancel_tagged_slurm_jobs(output_path: str, up_to: int, partition: str | None = None) -> None:
    """Cancel every Slurm job of the step's executions up to generation ``up_to``, looking again
    until none is left pending or running (a supervisor cancelled in the middle of submitting leaves
    replicas the first look did not see); bounded by :data:`FENCE_WAIT_S`. A Slurm that cannot be
    asked is logged, not raised: the replicas' own fence checks still stop what runs."""
    from fray.cluster.slurm_client import SlurmClient
    from fray.cluster.slurm_commands import SlurmError

    prefix = execution_tag(output_path)
    client = SlurmClient(partition, check_resources=False)
    deadline = time.monotonic() + FENCE_WAIT_S
    cancelled: set[str] = set()
    try:
        while True:
            jobs = [job for job in client.tagged_jobs(prefix) if job.state in ("PENDING", "RUNNING", "CONFIGURING")
                    and (generation := _tag_generation(job.tag, prefix)) is not None and generation <= up_to]
            fresh = [job for job in jobs if job.slurm_id not in cancelled]
            if fresh:
                logger.warning("Cancelling Slurm job(s) of fenced-off executions of %s: %s", output_path, ", ".join(
                    f"{job.slurm_id} (g{_tag_generation(job.tag, prefix)}, {job.state})" for job in fresh))
                client.cancel(job.slurm_id for job in fresh)
                cancelled.update(job.slurm_id for job in fresh)
            if not jobs or time.monotonic() >= deadline:
                if jobs:
                    logger.warning("Slurm job(s) %s of fenced-off executions of %s still not ended after %.0f s",
                                   ", ".join(job.slurm_id for job in jobs), output_path, FENCE_WAIT_S)
                return
            time.sleep(0.5)
    except SlurmError as exc:
        logger.warning("Could not look for the Slurm jobs of fenced-off executions of %s: %s", output_path, exc)
