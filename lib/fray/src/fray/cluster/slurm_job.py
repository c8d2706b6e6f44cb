"""One fray job as one Slurm batch job: the submitting side's :class:`JobHandle`.

The job's folder, on storage both the submitting machine and the nodes see, is the only channel
between this handle and :mod:`fray.cluster.slurm_worker` on the node (see that module for the
files). Slurm's controller says where the job is in its life (``squeue``, one call for all of a client's
jobs; ``scontrol show job`` for a batch script's exit status); the
worker's ``exit_code`` file says how the command ended, since a Slurm without accounting keeps
no exit codes once a job is forgotten, and since a batch script's status cannot tell a command's
own 75 from the worker's.

How Slurm's states become fray's:

=====================================================  =========================================
Slurm                                                  fray
=====================================================  =========================================
PENDING, CONFIGURING, REQUEUED, SUSPENDED              PENDING
RUNNING (before ``start`` of a ``start=False`` job)    PENDING
RUNNING, COMPLETING                                    RUNNING
COMPLETED, FAILED                                      SUCCEEDED / FAILED by the command's exit code
OUT_OF_MEMORY                                          FAILED
CANCELLED                                              STOPPED (``terminate()`` or ``scancel``)
TIMEOUT, DEADLINE                                      TIMED_OUT
NODE_FAIL, BOOT_FAIL, PREEMPTED                        LOST (the machine or the allocation was lost)
forgotten by the controller, no exit code recorded     LOST
=====================================================  =========================================
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass

from rigging.log import get_logger
from rigging.secrets import split_secrets

from fray.cluster.client import JobStatus, read_whole_log
from fray.cluster.slurm_commands import (
    JobStateBoard,
    SlurmCommandError,
    SlurmError,
    SlurmJobRecord,
    SlurmUnavailableError,
    job_record,
    run_slurm,
)
from fray.cluster.slurm_worker import write_atomically
from fray.errors import FrayError

logger = get_logger(__name__)

READ_LIMIT = 4 << 20
WAIT_POLL_S = 0.2
# A worker writes its exit code before it exits; on shared storage the file may show up a moment
# after Slurm reports the job ended.
RECORD_GRACE_S = 3.0
# How long Slurm may go on calling a job RUNNING after its command's exit code was recorded, and
# how often it is asked meanwhile.
SLURM_SETTLE_S = 30.0
ENDING_POLL_S = 0.2
# Slurm's KillWait (30 s by default) between its SIGTERM and SIGKILL, with room to spare.
KILL_WAIT_ALLOWANCE_S = 35.0

_WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD",
            "SPECIAL_EXIT", "RESIZING"}
_ACTIVE = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED"}
_BY_SLURM = {
    "CANCELLED": JobStatus.STOPPED,
    "TIMEOUT": JobStatus.TIMED_OUT,
    "DEADLINE": JobStatus.TIMED_OUT,
    "NODE_FAIL": JobStatus.LOST,
    "BOOT_FAIL": JobStatus.LOST,
    "PREEMPTED": JobStatus.LOST,
    "OUT_OF_MEMORY": JobStatus.FAILED,
}


class SlurmAllocationTimeout(FrayError, TimeoutError):
    """A Slurm job did not get its allocation in time (``free_address`` of a job still queued)."""


class SlurmJobEnded(FrayError, RuntimeError):
    """A Slurm job ended before it got its allocation or could be started."""


@dataclass(frozen=True)
class SlurmTimings:
    """How the handle talks to the controller: seconds per Slurm command, between queries, for an allocation."""

    command_timeout_s: float = 20.0
    poll_interval_s: float = 1.0
    allocation_timeout_s: float = 1800.0
    terminate_grace_s: float = 5.0


class SlurmJob:
    """The handle of Slurm job ``slurm_id`` whose files are in ``folder``; see the module docstring.

    ``job_id`` is Slurm's job id, what ``squeue`` shows and ``scancel`` takes.
    """

    def __init__(self, slurm_id: str, folder: str, name: str, *, started: bool, timings: SlurmTimings,
                 board: JobStateBoard | None = None) -> None:
        self.job_id = slurm_id
        self._board = board or JobStateBoard()
        self._board.follow(slurm_id)
        self.folder = folder
        self.name = name
        self.timings = timings
        self._started = started
        self._stopped = False
        self._released = False
        self._final: tuple[JobStatus, int | None] | None = None
        self._record: SlurmJobRecord | None = None
        self._queried_at = float("-inf")
        self._forgotten = False  # the controller answered that it no longer knows the job
        self._ended_at: float | None = None  # when the worker's exit code first showed up

    def __repr__(self) -> str:
        return f"SlurmJob({self.job_id!r}, {self.name!r})"

    def locator(self) -> dict[str, str]:
        """What another process needs to find this job again (:meth:`SlurmClient.attach`)."""
        return {"backend": "slurm", "slurm_id": self.job_id, "folder": self.folder, "name": self.name}

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    # -- what Slurm and the worker say ----------------------------------------------------------------

    def _recorded_exit_code(self) -> int | None:
        try:
            with open(self._path("exit_code")) as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            return None

    def _query(self, *, interval_s: float) -> SlurmJobRecord | None:
        """Slurm's record, at most ``interval_s`` old (iris polls its replicas ten times a second), from
        the board all of this process's jobs share."""
        if time.monotonic() - self._queried_at >= interval_s:
            try:
                self._record = self._board.record(self.job_id, max_age_s=interval_s,
                                                  timeout=self.timings.command_timeout_s)
                self._forgotten = self._record is None
            except SlurmError as exc:  # a controller away for a moment: keep what it said last
                logger.warning("Slurm job %s: cannot read its state (%s)", self.job_id, exc)
            self._queried_at = time.monotonic()
        return self._record

    def _exit_code_from_slurm(self) -> int | None:
        """The batch script's exit status, which only ``scontrol`` knows (asked once, for a worker that died)."""
        try:
            record = job_record(self.job_id, timeout=self.timings.command_timeout_s)
        except SlurmError as exc:
            logger.warning("Slurm job %s: cannot read its exit code (%s)", self.job_id, exc)
            return None
        return record.exit_code if record is not None else None

    def status(self) -> JobStatus:
        if self._final is not None:
            return self._final[0]
        code = self._recorded_exit_code()
        # Once the command has ended, ask more often: only Slurm can say whether it was a time limit.
        interval = self.timings.poll_interval_s if code is None else min(self.timings.poll_interval_s, ENDING_POLL_S)
        record = self._query(interval_s=interval)
        state = record.state if record is not None else None
        if code is not None and state in _ACTIVE | _WAITING:
            # At a time limit or a cancel the command may end (and be recorded) before the controller
            # moves the job from RUNNING/COMPLETING to TIMEOUT or CANCELLED: wait for its word, a while.
            self._ended_at = self._ended_at or time.monotonic()
            if time.monotonic() - self._ended_at < SLURM_SETTLE_S:
                return JobStatus.RUNNING if self._started else JobStatus.PENDING
        if code is None and state in _WAITING:
            return JobStatus.PENDING
        if code is None and state in _ACTIVE:
            return JobStatus.RUNNING if self._started else JobStatus.PENDING
        if code is None and not self._forgotten and state is None:
            return JobStatus.PENDING  # never reached the controller's answer yet
        if code is None:  # Slurm says it ended (or forgot it): give the worker's record a moment to show up
            deadline = time.monotonic() + RECORD_GRACE_S
            while code is None and time.monotonic() < deadline:
                time.sleep(0.2)
                code = self._recorded_exit_code()
        return self._settle(state, code)

    def _settle(self, state: str | None, code: int | None) -> JobStatus:
        if state in _BY_SLURM:
            status = _BY_SLURM[state]
        elif code is None and state is None:
            status = JobStatus.LOST  # forgotten by the controller with no word from the worker
        elif self._stopped:
            status = JobStatus.STOPPED
        else:
            if code is None:
                code = self._exit_code_from_slurm()  # the worker itself died: the batch script's status is all there is
            status = JobStatus.SUCCEEDED if code == 0 else JobStatus.FAILED
        if status is JobStatus.LOST:
            code = None
        elif code is None and status is not JobStatus.STOPPED:
            code = self._exit_code_from_slurm()
        self._final = (status, code)
        self._board.forget(self.job_id)
        return status

    def wait(self, timeout: float | None = None) -> JobStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (status := self.status()).finished:
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(WAIT_POLL_S)
        return status

    def exit_code(self) -> int | None:
        return self._final[1] if self.status().finished else None

    # -- output -------------------------------------------------------------------------------------------

    def read_log(self, offset: int = 0) -> bytes:
        try:
            with open(self._path("output.log"), "rb") as handle:
                handle.seek(offset)
                return handle.read(READ_LIMIT)
        except FileNotFoundError:  # not yet created by slurmd, or released
            return b""

    def logs(self) -> str:
        return read_whole_log(self.read_log)

    # -- a job placed with start=False ---------------------------------------------------------------------

    def free_address(self) -> str:
        """``HOST:PORT`` free on the job's node; blocks until the job holds its allocation."""
        deadline = time.monotonic() + self.timings.allocation_timeout_s
        while True:
            try:
                with open(self._path("address")) as handle:
                    return handle.read().strip()
            except FileNotFoundError:
                pass
            status = self.status()
            if status.finished:
                raise SlurmJobEnded(f"Slurm job {self.job_id} ({self.name!r}) ended {status.value} before it held "
                                    f"its allocation; its log: {self._path('output.log')}")
            if time.monotonic() >= deadline:
                reason = self._record.reason if self._record is not None else "unknown"
                raise SlurmAllocationTimeout(
                    f"Slurm job {self.job_id} ({self.name!r}) has no allocation after "
                    f"{self.timings.allocation_timeout_s:g} s (Slurm's reason: {reason}); `squeue -j {self.job_id}` "
                    "shows why, or raise SlurmClient(allocation_timeout_s=...)")
            time.sleep(WAIT_POLL_S)

    def start(self, env: Mapping[str, str] | None = None) -> None:
        """Let the command run, with ``env`` added to the request's variables (it starts once allocated)."""
        if self._started or self._released or self._final is not None:
            raise RuntimeError(f"Job {self.job_id} was already started.")
        public, secret = split_secrets({str(k): str(v) for k, v in (env or {}).items()})
        if secret:  # before start.json, which tells the worker to read both (see fray.cluster.slurm_worker)
            write_atomically(self._path("start-secrets.json"), json.dumps(secret), private=True)
        write_atomically(self._path("start.json"), json.dumps(public))
        self._started = True

    # -- stopping -----------------------------------------------------------------------------------------

    def terminate(self) -> None:
        """SIGTERM to the command, once: ``scancel --batch --signal=TERM`` reaches only the worker, which
        forwards it (a plain ``scancel`` would signal every process of the job *and* be forwarded, so the
        command would hear it twice). After ``terminate_grace_s`` whatever is left is cancelled (Slurm's
        SIGTERM, then SIGKILL after its ``KillWait``), and killed outright if it still lingers. A job not
        yet on a node is simply cancelled. Returns once the job has ended."""
        if self.status().finished:
            return
        if self._recorded_exit_code() is not None:  # the command has ended: only Slurm's word is missing
            self.wait(timeout=SLURM_SETTLE_S)
            return
        self._stopped = True
        if os.path.exists(self._path("address")):  # the worker runs
            self._scancel(["--batch", "--signal=TERM"])
            if self.wait(timeout=self.timings.terminate_grace_s).finished:
                return
        self._scancel([])
        if not self.wait(timeout=self.timings.terminate_grace_s + KILL_WAIT_ALLOWANCE_S).finished:
            self._scancel(["--full", "--signal=KILL"])
            self.wait(timeout=60 + self.timings.command_timeout_s)

    def _scancel(self, options: list[str]) -> None:
        try:
            run_slurm(["scancel", *options, self.job_id], timeout=self.timings.command_timeout_s)
        except SlurmCommandError as exc:  # it ended meanwhile
            logger.debug("scancel %s: %s", self.job_id, exc)
        except SlurmUnavailableError as exc:
            logger.warning("Slurm job %s: cannot cancel it: %s", self.job_id, exc)

    def release(self) -> None:
        """Stop the job if it runs and remove its folder (its log); status and exit code stay."""
        if self._released:
            return
        self.terminate()
        self.status()  # settled before the exit code's file goes
        self._released = True
        shutil.rmtree(self.folder, ignore_errors=True)
