"""``python -m iris.supervisor HOME JOB_ID``: run one job to its end, retrying as its budgets allow.

Started detached by ``iris job run`` (a session of its own, so the CLI can return and a closed
terminal does not take the job with it). One attempt starts every replica; the attempt ends when
all replicas exit 0 (SUCCEEDED), or as soon as one exits non-zero: the others are stopped, since
the replicas of a job only make progress together, and the attempt counts once as

* PREEMPTED: a replica exited with ``PREEMPTED_EXIT_CODE``, was killed by SIGTERM from outside, or
  its machine went away (fray reports the job LOST);
* FAILED: any other non-zero exit.

A preempted attempt is retried while ``max_retries_preemption`` allows, a failed one while
``max_retries_failure`` allows. ``iris job stop`` (SIGTERM to this process, plus a flag in the
database) stops the replicas and ends the job STOPPED.

Each replica is a fray job (``client.submit``) on the job's backend, a ``LocalClient`` or a
``RayClient``: fray places, starts and stops the process; this module decides when, and copies
each replica's output into the job's log folder.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import threading
import time
from pathlib import Path

from fray.cluster import DistributedClient, JobHandle, JobRequest, JobStatus, LocalClient
from rigging.log import get_logger, setup_logging

from iris.spec import PREEMPTED_EXIT_CODE, JobSpec
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
    """One replica of an attempt: a fray job, and the copy of its output in the job's log folder."""

    def __init__(self, job: JobHandle, log_path: Path) -> None:
        self.job = job
        self.log_path = log_path
        self._copied = 0
        self._exit_code: int | None = None
        self._append(b"")  # every replica has its log file, even one that never writes

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs; a replica whose machine went away counts as preempted."""
        if self._exit_code is None:
            status = self.job.status()
            if status is JobStatus.LOST:
                self._append(b"\niris: lost this replica's machine or worker; counted as preempted\n")
                self._exit_code = PREEMPTED_EXIT_CODE
            elif status.finished:
                self._exit_code = self.job.exit_code()
        return self._exit_code

    def stop(self) -> int | None:
        self.job.terminate()
        self.sync_logs()
        return self.poll()

    def sync_logs(self) -> None:
        while chunk := self.job.read_log(self._copied):
            self._append(chunk)
            self._copied += len(chunk)

    def _append(self, data: bytes) -> None:
        with open(self.log_path, "ab") as handle:
            handle.write(data)


def classify(exit_codes: list[int | None], stopped_by_us: list[bool]) -> str:
    """One attempt's outcome from its replicas' exit codes (see the module docstring)."""
    own = [code for code, ours in zip(exit_codes, stopped_by_us) if not ours]
    if all(code == 0 for code in exit_codes):
        return "SUCCEEDED"
    if any(code == PREEMPTED_EXIT_CODE or code == -signal.SIGTERM for code in own):
        return "PREEMPTED"
    return "FAILED"


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
        finally:
            client.shutdown()

    def _run_attempts(self, client: DistributedClient, log_folder: Path) -> JobState:
        spec = self.spec
        preemptions = failures = 0
        attempt = 0
        while True:
            if self.stop_requested():
                self.store.transition(self.job_id, JobState.STOPPED, "stopped before the next attempt")
                return JobState.STOPPED
            attempt += 1
            self.store.start_attempt(self.job_id, attempt)
            logger.info("Job %s: attempt %d starts %d replica(s) on %s", self.job_id, attempt, spec.replicas, spec.backend)
            self.store.transition(self.job_id, JobState.RUNNING, f"attempt {attempt}: {spec.replicas} replica(s)")
            outcome, codes, first_bad = self._run_one_attempt(client, log_folder, attempt)
            self.store.end_attempt(self.job_id, attempt, outcome, codes)
            logger.info("Job %s: attempt %d %s (exit codes %s)", self.job_id, attempt, outcome, codes)
            if outcome == "SUCCEEDED":
                self.store.transition(self.job_id, JobState.SUCCEEDED, f"attempt {attempt} succeeded", exit_code=0)
                return JobState.SUCCEEDED
            if outcome == "STOPPED":
                self.store.transition(self.job_id, JobState.STOPPED, f"stopped during attempt {attempt}", exit_code=first_bad)
                return JobState.STOPPED
            # Preemptions and plain failures spend separate budgets; either way a retry reruns every replica.
            if outcome == "PREEMPTED":
                preemptions += 1
                what, kind, used, budget = "was preempted", "preemption", preemptions, spec.max_retries_preemption
            else:
                failures += 1
                what, kind, used, budget = "failed", "failure", failures, spec.max_retries_failure
            if used > budget:
                self.store.transition(
                    self.job_id, JobState.FAILED,
                    f"attempt {attempt} {what} (exit codes {codes}); {kind} budget {budget} spent",
                    exit_code=first_bad,
                )
                return JobState.FAILED
            self.store.transition(
                self.job_id, JobState.RETRYING,
                f"attempt {attempt} {what} (exit codes {codes}); {kind} retry {used} of {budget}",
                exit_code=first_bad,
            )

    def _run_one_attempt(self, client: DistributedClient, log_folder: Path, attempt: int) -> tuple[str, list[int | None], int | None]:
        """Run every replica once: (outcome, exit codes, the exit code that ended the attempt)."""
        spec = self.spec
        request = JobRequest(f"{self.job_id}-attempt-{attempt}", spec.command, resources=spec.resources, cwd=spec.cwd)
        replicas: list[Replica] = []
        try:
            for index in range(spec.replicas):
                log_path = log_folder / f"attempt-{attempt:03d}-replica-{index:03d}.log"
                replicas.append(Replica(client.submit(request, start=False), log_path))
            # jax.distributed's coordinator runs in process 0, so its address is on replica 0's machine.
            coordinator = replicas[0].job.free_address()
            # A coordinator on loopback has every peer on this machine: nothing off it should reach it.
            # JAX's own variable, so any program calling jax.distributed.initialize listens only where it
            # must; the job's env may still override it.
            bind_env = {"JAX_COORDINATOR_BIND_ADDRESS": coordinator} if _is_loopback(coordinator) else {}
            for index, replica in enumerate(replicas):
                replica.job.start({
                    **bind_env,
                    **dict(spec.env),
                    "IRIS_JOB_ID": self.job_id,
                    "IRIS_ATTEMPT": str(attempt),
                    "IRIS_REPLICA_INDEX": str(index),
                    "IRIS_NUM_REPLICAS": str(spec.replicas),
                    "IRIS_COORDINATOR_ADDRESS": coordinator,
                })
            return self._watch(replicas)
        finally:
            for replica in replicas:
                replica.stop()  # a no-op for replicas that have exited
                replica.job.release()

    def _watch(self, replicas: list[Replica]) -> tuple[str, list[int | None], int | None]:
        codes: list[int | None] = [None] * len(replicas)
        stopped_by_us = [False] * len(replicas)
        while True:
            for index, replica in enumerate(replicas):
                if codes[index] is None:
                    codes[index] = replica.poll()
                replica.sync_logs()
            if all(code is not None for code in codes):
                return classify(codes, stopped_by_us), codes, _cause(codes, stopped_by_us)
            broken = any(code not in (None, 0) for code in codes)
            stopping = self.stop_requested()
            if broken or stopping:
                # All-or-nothing: the others cannot finish without the broken one.
                for index, replica in enumerate(replicas):
                    if codes[index] is None:
                        stopped_by_us[index] = True
                        codes[index] = replica.stop()
                cause = _cause(codes, stopped_by_us)
                if stopping:
                    return "STOPPED", codes, cause
                return classify(codes, stopped_by_us), codes, cause
            time.sleep(POLL_INTERVAL_S)


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
