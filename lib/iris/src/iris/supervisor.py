"""``python -m iris.supervisor HOME JOB_ID``: run one job to its end, retrying as its budgets allow.

Started detached by ``iris job run`` (a session of its own, so the CLI can return and a closed
terminal does not take the job with it). One attempt starts every replica; the attempt ends when
all replicas exit 0 (SUCCEEDED), or as soon as one exits non-zero: the others are stopped, since
the replicas of a job only make progress together, and the attempt counts once as

* PREEMPTED: a replica exited with ``PREEMPTED_EXIT_CODE``, was killed by SIGTERM from outside, or
  its machine went away (fray reports the job LOST);
* TIMED_OUT: a replica ran past the job's ``time_limit_s`` (ended by Slurm, or here on the other
  backends), whatever it exited with: the limit is the job's own setting, so it is not a preemption;
* FAILED: any other non-zero exit; one exit with ``FENCED_OFF_EXIT_CODE`` (the job's work belongs to
  someone else now) ends the job FAILED at once, whatever its budget.

A preempted attempt is retried while ``max_retries_preemption`` allows, a failed or timed-out one
while ``max_retries_failure`` allows (:mod:`iris.retries` decides). With ``attempts_folder`` set,
each attempt's output and record are also kept there (:mod:`iris.attempt_log`), the supervisor
being its only writer. An attempt that did not succeed ends each replica's log with one line of
iris's own saying how it ended and what iris does next, so the log's last word is never a
traceback or the scheduler's "CANCELLED" that a preemption leaves. ``iris job stop`` (SIGTERM to
this process, plus a flag in the database) stops the replicas and ends the job STOPPED.

Each replica is a fray job (``client.submit``) on the job's backend, a ``LocalClient``, a
``RayClient`` or a ``SlurmClient``: fray places, starts and stops the process; this module decides when, and copies
each replica's output into the job's log folder.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fray.cluster import DistributedClient, JobHandle, JobRequest, JobStatus, LocalClient, UnschedulableError
from rigging.log import get_logger, setup_logging
from rigging.secrets import RedactingStream

from iris.attempt_log import AttemptLog, AttemptOutcome
from iris.retries import AttemptVerdict, judge
from iris.spec import FENCED_OFF_EXIT_CODE, PREEMPTED_EXIT_CODE, JobSpec
from iris.store import JobState, JobStore

logger = get_logger("iris.supervisor")  # not "__main__" when run with -m

POLL_INTERVAL_S = 0.1
# How often the database's stop flag is read (the SIGTERM path is immediate).
STOP_FLAG_INTERVAL_S = 1.0


def replica_client(spec: JobSpec) -> DistributedClient:
    """The fray client that places the job's replicas; refuses at once a request no node can ever hold.

    ``local`` is fray's threads client (each replica is a child process either way); ``ray`` gets a
    client of its own rather than the shared one, because without an address it starts a private
    cluster sized to the job's replicas and ends it with the job.
    """
    if spec.backend == "local":
        return LocalClient()
    if spec.backend == "slurm":
        from fray.cluster.slurm_client import SlurmClient

        client = SlurmClient(spec.slurm_partition)
        client.check_fits(spec.resources, what=f"job {spec.name!r}")
        return client
    from fray.cluster.ray_client import RayClient

    # address None: a private local cluster for this job, sized to the replicas it runs.
    init_kwargs = {"include_dashboard": False, "log_to_driver": False}
    if spec.ray_address is None:
        init_kwargs["num_cpus"] = max(1, int(spec.resources.cpu * spec.replicas + 0.999))
    client = RayClient(spec.ray_address, **init_kwargs)
    try:
        client.check_fits(spec.resources, what=f"job {spec.name!r}")
    except BaseException:
        client.shutdown()
        raise
    return client


class Replica:
    """One replica of an attempt: a fray job, and the copies of its output (the job's log folder, and
    the attempt's folder when the job keeps one), both with known secret values redacted."""

    def __init__(self, job: JobHandle, log_path: Path, index: int, attempt_log: AttemptLog | None) -> None:
        self.job = job
        self.log_path = log_path
        self.index = index
        self.attempt_log = attempt_log
        self._redactor = RedactingStream()
        self._copied = 0
        self._exit_code: int | None = None
        self.timed_out = False
        self._append(b"")  # every replica has its log file, even one that never writes

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs; a replica whose machine went away counts as preempted."""
        if self._exit_code is None:
            status = self.job.status()
            if status is JobStatus.LOST:
                self.note("lost this replica's machine or worker; counted as preempted")
                self._exit_code = PREEMPTED_EXIT_CODE
            elif status is JobStatus.TIMED_OUT:
                self.timed_out = True
                self.sync_logs()
                self.note("the cluster ended this replica at the job's time limit")
                code = self.job.exit_code()
                self._exit_code = code if code not in (None, 0) else 1
            elif status.finished:
                self._exit_code = self.job.exit_code()
        return self._exit_code

    def stop(self) -> int | None:
        self.job.terminate()
        self.sync_logs()
        self._write(self._redactor.flush())  # it has ended: what was held back cannot grow into a secret
        return self.poll()

    def sync_logs(self) -> None:
        while chunk := self.job.read_log(self._copied):
            self._append(chunk)
            self._copied += len(chunk)

    def note(self, text: str) -> None:
        """A line of iris's own in the replica's log, set apart from the replica's output."""
        self._append(f"\niris: {text}\n".encode())

    def _append(self, data: bytes) -> None:
        self._write(self._redactor.feed(data))

    def _write(self, data: bytes) -> None:
        with open(self.log_path, "ab") as handle:
            handle.write(data)
        if self.attempt_log is not None:
            self.attempt_log.append(self.index, data)


def classify(exit_codes: list[int | None], stopped_by_us: list[bool], timed_out: list[bool] | None = None) -> str:
    """One attempt's outcome (an :class:`AttemptOutcome` value) from its replicas (see the module docstring)."""
    own = [code for code, ours in zip(exit_codes, stopped_by_us) if not ours]
    if all(code == 0 for code in exit_codes):
        return AttemptOutcome.SUCCEEDED.value
    if any(timed_out or ()):
        return AttemptOutcome.TIMED_OUT.value
    if any(code == PREEMPTED_EXIT_CODE or code == -signal.SIGTERM for code in own):
        return AttemptOutcome.PREEMPTED.value
    return AttemptOutcome.FAILED.value


def describe_ending(outcome: str, codes: list[int | None], stopped_by_us: list[bool], timed_out: list[bool]) -> str:
    """Why an attempt ended, in words, for its record: which replica did what."""
    if outcome == AttemptOutcome.SUCCEEDED.value:
        return "every replica exited 0"
    if outcome == AttemptOutcome.STOPPED.value:
        return "stopped on request (iris job stop, or the run that started it was interrupted)"
    for index, (code, ours, late) in enumerate(zip(codes, stopped_by_us, timed_out)):
        if ours or code in (None, 0):
            continue
        if late:
            return f"replica {index} was ended at the job's time limit (exit {code})"
        if code == PREEMPTED_EXIT_CODE:
            return f"replica {index} exited {code}: preempted, saved what it could"
        if code == -signal.SIGTERM:
            return f"replica {index} was killed by SIGTERM from outside (preempted)"
        if code is not None and code < 0:
            return f"replica {index} was killed by signal {-code}"
        return f"replica {index} exited {code}"
    return f"exit codes {codes}"


class Supervisor:
    def __init__(self, store: JobStore, job_id: str) -> None:
        self.store = store
        self.job_id = job_id
        record = store.get(job_id)
        if record is None:
            raise SystemExit(f"iris supervisor: no job {job_id!r} in {store.db_path}")
        self.spec = record.spec
        self.stop_event = threading.Event()
        self._last_flag_check = 0.0

    def stop_requested(self) -> bool:
        now = time.monotonic()
        if not self.stop_event.is_set() and now - self._last_flag_check >= STOP_FLAG_INTERVAL_S:
            self._last_flag_check = now
            record = self.store.get(self.job_id)
            if record is not None and record.stop_requested:
                self.stop_event.set()
        return self.stop_event.is_set()

    def run(self) -> JobState:
        spec = self.spec
        log_folder = self.store.log_folder(self.job_id)
        log_folder.mkdir(parents=True, exist_ok=True)
        try:
            client = replica_client(spec)
        except Exception as exc:  # noqa: BLE001 - any start-up failure is the job's final word
            self.store.transition(self.job_id, JobState.FAILED, f"backend {spec.backend!r} could not start: {exc}")
            return JobState.FAILED
        try:
            return self._run_attempts(client, log_folder)
        except UnschedulableError as exc:
            # No node could ever hold the replicas, or the autoscaler's node never came: the job's
            # final word, in one line rather than as a supervisor crash.
            self.store.transition(self.job_id, JobState.FAILED, f"its replicas could not be placed: {exc}")
            return JobState.FAILED
        finally:
            client.shutdown()

    def _run_attempts(self, client: DistributedClient, log_folder: Path) -> JobState:
        spec = self.spec
        verdicts: list[AttemptVerdict] = []
        attempt = 0
        while True:
            if self.stop_requested():
                self.store.transition(self.job_id, JobState.STOPPED, "stopped before the next attempt")
                return JobState.STOPPED
            attempt += 1
            self.store.start_attempt(self.job_id, attempt)
            logger.info("Job %s: attempt %d starts %d replica(s) on %s", self.job_id, attempt, spec.replicas, spec.backend)
            self.store.transition(self.job_id, JobState.RUNNING, f"attempt {attempt}: {spec.replicas} replica(s)")
            verdict, first_bad = self._run_one_attempt(client, log_folder, attempt, verdicts)
            verdicts.append(verdict)
            self.store.end_attempt(self.job_id, attempt, verdict.outcome.value, list(verdict.exit_codes))
            logger.info("Job %s: attempt %d %s", self.job_id, attempt, verdict.describe())
            message = f"attempt {attempt} {verdict.describe()}"
            if verdict.outcome is AttemptOutcome.SUCCEEDED:
                self.store.transition(self.job_id, JobState.SUCCEEDED, f"attempt {attempt} succeeded", exit_code=0)
                return JobState.SUCCEEDED
            if verdict.outcome is AttemptOutcome.STOPPED:
                self.store.transition(self.job_id, JobState.STOPPED, f"stopped during attempt {attempt}", exit_code=first_bad)
                return JobState.STOPPED
            # Preemptions and plain failures spend separate budgets; either way a retry reruns every replica.
            if not verdict.retried:
                code = FENCED_OFF_EXIT_CODE if verdict.fenced_off else first_bad
                self.store.transition(self.job_id, JobState.FAILED, message, exit_code=code)
                return JobState.FAILED
            self.store.transition(self.job_id, JobState.RETRYING, message, exit_code=first_bad)

    def _run_one_attempt(self, client: DistributedClient, log_folder: Path, attempt: int,
                         earlier: list[AttemptVerdict]) -> tuple[AttemptVerdict, int | None]:
        """Run every replica once: the verdict on the attempt, and the exit code that ended it."""
        spec = self.spec
        request = JobRequest(f"{self.job_id}-attempt-{attempt}", spec.command, resources=spec.resources, cwd=spec.cwd,
                             time_limit_s=spec.time_limit_s, tag=spec.tag)
        attempt_log = self._begin_attempt_log(attempt)
        replicas: list[Replica] = []
        outcome, codes, cause = AttemptOutcome.FAILED.value, [None] * spec.replicas, None
        verdict: AttemptVerdict | None = None
        reason = "the replicas could not be started"
        try:
            for index in range(spec.replicas):
                log_path = log_folder / f"attempt-{attempt:03d}-replica-{index:03d}.log"
                replicas.append(Replica(client.submit(request, start=False), log_path, index, attempt_log))
            if attempt_log is not None:
                attempt_log.placed([replica.job.job_id for replica in replicas])
            # Every replica holds its place (on Slurm: its allocation) before any starts: all-or-nothing.
            # jax.distributed's coordinator runs in process 0, so its address is on replica 0's machine.
            coordinator = [replica.job.free_address() for replica in replicas][0]
            # A coordinator on loopback has every peer on this machine: nothing off it should reach it.
            # JAX's own variable, so any program calling jax.distributed.initialize listens only where it
            # must; the job's env may still override it.
            bind_env = {"JAX_COORDINATOR_BIND_ADDRESS": coordinator} if _is_loopback(coordinator) else {}
            secrets = self._secret_env()
            for index, replica in enumerate(replicas):
                replica.job.start({
                    **bind_env,
                    **dict(spec.env),
                    **secrets,
                    "IRIS_JOB_ID": self.job_id,
                    "IRIS_ATTEMPT": str(attempt),
                    "IRIS_REPLICA_INDEX": str(index),
                    "IRIS_NUM_REPLICAS": str(spec.replicas),
                    "IRIS_COORDINATOR_ADDRESS": coordinator,
                })
            outcome, codes, cause, reason = self._watch(replicas)
            verdict = judge(attempt, AttemptOutcome(outcome), codes, earlier,
                            max_retries_preemption=spec.max_retries_preemption, max_retries_failure=spec.max_retries_failure)
            if verdict.outcome is not AttemptOutcome.SUCCEEDED:
                reason = f"{reason}; {verdict.consequence()}"
            return verdict, cause
        except BaseException as exc:
            reason = f"{reason}: {type(exc).__name__}: {exc}"
            raise
        finally:
            for replica in replicas:
                replica.stop()  # a no-op for replicas that have exited; what they wrote last is copied
                if verdict is not None and verdict.outcome is not AttemptOutcome.SUCCEEDED:
                    # After everything the replica and its scheduler wrote (Slurm's "CANCELLED" line
                    # included), so the log ends saying why it ended and what comes next.
                    replica.note(f"this attempt ended {verdict.describe()}")
                replica.job.release()
            if attempt_log is not None:
                try:
                    attempt_log.finish(AttemptOutcome(outcome), reason, codes)
                except Exception:  # noqa: BLE001 - the job's own records are the ones that must not fail
                    logger.exception("Job %s: could not write attempt %d's record in %s", self.job_id, attempt, spec.attempts_folder)

    def _secret_env(self) -> dict[str, str]:
        """The values of the job's secret variables, from this process's environment (where
        :func:`iris.submit_job` put them): its record holds their names only."""
        missing = [name for name in self.spec.secret_env if name not in os.environ]
        if missing:
            logger.warning("Job %s: the secret variable(s) %s it names were not set where it was submitted; its "
                           "replicas run without them", self.job_id, ", ".join(missing))
        return {name: os.environ[name] for name in self.spec.secret_env if name in os.environ}

    def _begin_attempt_log(self, attempt: int) -> AttemptLog | None:
        spec = self.spec
        if spec.attempts_folder is None:
            return None
        try:
            return AttemptLog.begin(spec.attempts_folder, replicas=spec.replicas, engine=spec.backend, job_id=self.job_id,
                                    job_attempt=attempt)
        except Exception:  # noqa: BLE001 - a copy of the logs; the job runs without it
            logger.exception("Job %s: cannot keep attempt %d's output in %s", self.job_id, attempt, spec.attempts_folder)
            return None

    def _watch(self, replicas: list[Replica]) -> tuple[str, list[int | None], int | None, str]:
        codes: list[int | None] = [None] * len(replicas)
        stopped_by_us = [False] * len(replicas)
        # Slurm ends a job at its time limit itself; elsewhere the supervisor does.
        deadline = None
        if self.spec.time_limit_s is not None and self.spec.backend != "slurm":
            deadline = time.monotonic() + self.spec.time_limit_s

        def ended(outcome: str) -> tuple[str, list[int | None], int | None, str]:
            timed_out = [replica.timed_out for replica in replicas]
            return outcome, codes, _cause(codes, stopped_by_us), describe_ending(outcome, codes, stopped_by_us, timed_out)

        while True:
            for index, replica in enumerate(replicas):
                if codes[index] is None:
                    codes[index] = replica.poll()
                replica.sync_logs()
            if all(code is not None for code in codes):
                return ended(classify(codes, stopped_by_us, [r.timed_out for r in replicas]))
            late = deadline is not None and time.monotonic() >= deadline
            if late:
                running = [index for index, code in enumerate(codes) if code is None]
                for index in running:
                    replicas[index].timed_out = True
                    replicas[index].note("ending this replica at the job's time limit")
                for index, code in zip(running, stop_together([replicas[index] for index in running])):
                    codes[index] = code
                return ended(AttemptOutcome.TIMED_OUT.value)
            broken = any(code not in (None, 0) for code in codes)
            stopping = self.stop_requested()
            if broken or stopping:
                # All-or-nothing: the others cannot finish without the broken one.
                running = [index for index, code in enumerate(codes) if code is None]
                for index, code in zip(running, stop_together([replicas[index] for index in running])):
                    stopped_by_us[index] = True
                    codes[index] = code
                if stopping:
                    return ended(AttemptOutcome.STOPPED.value)
                return ended(classify(codes, stopped_by_us, [r.timed_out for r in replicas]))
            time.sleep(POLL_INTERVAL_S)


def stop_together(replicas: list[Replica]) -> list[int | None]:
    """Stop ``replicas`` all at once; their exit codes, in order.

    The peers of a replica that died are often blocked in a collective with it and ignore SIGTERM
    until their grace period ends: stopped together, a gang of any size ends within one grace
    period, where one after the other it would take one per replica.
    """
    if not replicas:
        return []
    with ThreadPoolExecutor(max_workers=len(replicas), thread_name_prefix="iris-stop") as pool:
        return list(pool.map(lambda replica: replica.stop(), replicas))


def _cause(codes: list[int | None], stopped_by_us: list[bool]) -> int | None:
    """The first non-zero exit code of a replica iris did not stop itself (0 when all succeeded)."""
    own = [code for code, ours in zip(codes, stopped_by_us) if not ours and code is not None]
    return next((code for code in own if code != 0), 0 if own and not any(stopped_by_us) else None)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.rsplit(":", 1)[0]).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m iris.supervisor IRIS_HOME JOB_ID", file=sys.stderr)
        return 2
    setup_logging()
    home, job_id = argv
    store = JobStore(home)
    supervisor = Supervisor(store, job_id)
    store.set_supervisor(job_id, os.getpid())
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stop_event.set())
    try:
        state = supervisor.run()
    except BaseException as exc:
        store.transition(job_id, JobState.FAILED, f"supervisor error: {exc!r}")
        raise
    return 0 if state == JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
