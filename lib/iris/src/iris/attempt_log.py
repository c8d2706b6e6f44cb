"""Every attempt's output, kept beside the work it belongs to, on any storage.

A step (or any job given a folder) keeps one sub-folder per attempt, numbered in the order the
attempts started, across runs and across the engines that ran them::

    <folder>/.attempts/001/attempt.json      what ran and how it ended (see AttemptRecord)
    <folder>/.attempts/001/replica-000.log   stdout and stderr of replica 0, as written
    <folder>/.attempts/002/...

``attempt.json`` is written when the attempt starts (no ``outcome`` yet: it is running, or its
writer died) and again when it ends. A writer of many short attempts in its own process (a runner's
steps) may defer the first: the folder and the record then appear with the attempt's first output,
or once it ends, so a step that prints nothing makes its attempt's folder and record once. A log is appended to as output arrives on local disk; an
object store cannot append, so there the whole file is uploaded again at most every
:data:`REMOTE_FLUSH_S` seconds and once at the end. A reader therefore sees a running attempt's
output late by that much on a bucket, never a torn file.

Logs are kept with the writer's known secret values redacted (:mod:`rigging.secrets`): a step that
prints its W&B key leaves ``***`` in its log. Output that ends in what may be the start of a secret
is held back until more arrives or the log is flushed.

One writer per folder at a time: the step's lease (or iris's single supervisor per job) makes it so,
which is why the next number can be taken by listing the folder.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, BinaryIO

from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError, check_within, open_regular, read_bounded_text
from rigging.secrets import RedactingStream, secret_values

ATTEMPTS_FOLDER = ".attempts"
RECORD_FILE = "attempt.json"
REMOTE_FLUSH_S = 5.0


class AttemptOutcome(enum.Enum):
    """How an attempt ended. PREEMPTED spends a preemption budget; FAILED and TIMED_OUT a failure budget."""

    SUCCEEDED = "SUCCEEDED"
    PREEMPTED = "PREEMPTED"  # exit 75, SIGTERM from outside, or its machine went away
    FAILED = "FAILED"  # any other non-zero exit
    TIMED_OUT = "TIMED_OUT"  # killed by the scheduler at its time limit
    STOPPED = "STOPPED"  # stopped on purpose (iris job stop, the run was interrupted)

    @property
    def spends_failure_budget(self) -> bool:
        return self in (AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT)


@dataclass(frozen=True)
class AttemptRecord:
    """``attempt.json``: one attempt of a step or job."""

    attempt: int  # 1, 2, ... in the folder, across runs
    started_at: float
    replicas: int = 1
    engine: str = "local"  # where it ran: "local" (the runner's process), "local" / "ray" / "slurm" through iris
    job_id: str | None = None  # the iris job, when it ran through iris
    job_attempt: int | None = None  # the attempt number within that job
    host: str = field(default_factory=socket.gethostname)
    ended_at: float | None = None
    outcome: str | None = None  # an AttemptOutcome value; None while running (or if its writer died)
    reason: str = ""
    exit_codes: tuple[int | None, ...] = ()
    # Each replica's job id on the engine (Slurm's batch job id, Ray's actor, a local process's
    # job), once the replicas are placed: what `squeue`, `scancel` and the engine's own logs name.
    engine_jobs: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def to_json(self) -> str:
        # Plain values only: a shallow copy (asdict deep-copies every value), dumped on one line by
        # the C encoder (an indented dump takes the pure-Python one); written twice per attempt.
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["exit_codes"] = list(self.exit_codes)
        data["engine_jobs"] = list(self.engine_jobs)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> AttemptRecord:
        data = json.loads(text)
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        known["exit_codes"] = tuple(known.get("exit_codes") or ())
        known["engine_jobs"] = tuple(str(job) for job in known.get("engine_jobs") or ())
        return cls(**known)


def attempts_url(folder: str) -> str:
    return fsx.join(folder, ATTEMPTS_FOLDER)


def attempt_url(folder: str, attempt: int) -> str:
    return fsx.join(folder, ATTEMPTS_FOLDER, f"{attempt:03d}")


def replica_log_name(replica: int) -> str:
    return f"replica-{replica:03d}.log"


def _attempt_numbers(folder: str) -> list[int]:
    try:
        entries = fsx.ls(attempts_url(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    numbers = []
    for entry in entries:
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        if name.isdigit():
            numbers.append(int(name))
    return sorted(numbers)


class AttemptLog:
    """The writer of one attempt's folder: start it, feed it output, end it.

    ``append(replica, data)`` takes bytes as they arrive; ``finish(...)`` flushes every log and
    writes the final record. Thread-safe, so a step's output can arrive from several threads.

    ``durable`` (the default) puts each ``attempt.json`` on disk before it replaces the last one
    (``fsync``), so that what a retry budget is counted from survives a machine crash. A writer
    whose records only inform (a runner's own steps, whose reruns count nothing from them) passes
    ``False``: after a machine crash an attempt may then be listed without a readable record.
    """

    def __init__(self, folder: str, record: AttemptRecord, *, create_logs: bool = True, durable: bool = True,
                 record_pending: bool = False) -> None:
        self.folder = folder
        self.durable = durable
        # The opening record is not written yet: it goes with the first output (or the closing one).
        self._record_pending = record_pending
        self.url = attempt_url(folder, record.attempt)
        self.record = record
        self._local = fsx.is_local(folder)
        self._lock = threading.Lock()
        # Remote folders: each log is kept whole in a local file and uploaded as a whole.
        self._spool = None if self._local else tempfile.mkdtemp(prefix="iris-attempt-")
        self._dirty: set[int] = set()
        self._last_flush = 0.0
        # Each log (or its spool file) is opened once, not once a write, and flushed after every
        # write, so what append() returned from is in the file whatever happens to this process next.
        self._handles: dict[int, BinaryIO] = {}
        self._secrets = secret_values()  # this process's: each writer redacts what it knows
        self._redactors: dict[int, RedactingStream] = {}
        if create_logs:
            self._create_logs()

    def _create_logs(self) -> None:
        for replica in range(self.record.replicas):
            self.append(replica, b"")  # every replica has its log, even one that never writes
        self.flush()

    def __reduce__(self) -> tuple:
        # Sent to the process that runs the work: a writer of the same logs there (appending on
        # local disk, its own whole-file uploads on a bucket), which leaves the record to this one
        # (a late write there could otherwise replace the closing record written here).
        return (_log_writer, (self.folder, self.record))

    @classmethod
    def begin(cls, folder: str, *, replicas: int = 1, engine: str = "local", job_id: str | None = None,
              job_attempt: int | None = None, durable: bool = True, create_logs: bool = True,
              opening_record: bool = True) -> AttemptLog:
        """Number a new attempt after the folder's existing ones and write its opening record.

        ``create_logs=False`` makes each replica's log with its first output instead of at once
        (a writer of many short, mostly silent attempts then makes no empty file for each).
        ``opening_record=False`` (with ``create_logs=False``) defers the attempt's folder and
        opening record to its first output, or to :meth:`finish`: for a writer whose attempts run
        in its own process, where nothing else can write their records. The number is taken all
        the same; the one writer per folder (see the module's comment) keeps it free meanwhile."""
        if create_logs and not opening_record:
            raise ValueError("an attempt whose opening record waits for its first output makes its logs then too: "
                             "pass create_logs=False with opening_record=False")
        numbers = _attempt_numbers(folder)
        record = AttemptRecord(
            attempt=(numbers[-1] + 1) if numbers else 1,
            started_at=time.time(),
            replicas=replicas,
            engine=engine,
            job_id=job_id,
            job_attempt=job_attempt,
        )
        log = cls(folder, record, durable=durable, create_logs=False, record_pending=True)
        if opening_record:
            fsx.makedirs(attempt_url(folder, record.attempt))
            # The record first, so a reader finds the folder without it only for the moment between the two.
            log._write_record()
            if create_logs:
                log._create_logs()
        return log

    @property
    def attempt(self) -> int:
        return self.record.attempt

    def log_url(self, replica: int) -> str:
        return fsx.join(self.url, replica_log_name(replica))

    def append(self, replica: int, data: bytes) -> None:
        with self._lock:
            redactor = self._redactors.setdefault(replica, RedactingStream(self._secrets))
            self._write(replica, redactor.feed(data))
        if not self._local and time.monotonic() - self._last_flush >= REMOTE_FLUSH_S:
            self._upload()

    def _write(self, replica: int, data: bytes) -> None:
        handle = self._handles.get(replica)
        if handle is None:
            if self._record_pending:
                if not data:
                    return  # nothing to show yet: the attempt appears with its first output
                self._write_record()
            path = self._file_of(replica)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle = self._handles[replica] = open(path, "ab")
        handle.write(data)
        handle.flush()
        if not self._local:
            self._dirty.add(replica)

    def _file_of(self, replica: int) -> str:
        """The local file a replica's output is appended to: the log itself, or its spool copy."""
        if self._local:
            return fsx.filesystem(self.log_url(replica))[1]
        return os.path.join(self._spool, replica_log_name(replica))

    def _close_files(self) -> None:
        handles, self._handles = self._handles, {}
        for handle in handles.values():
            handle.close()

    def flush(self) -> None:
        """Write out everything appended so far: what was held back as a possible start of a secret,
        and (on an object store) the logs that changed since the last upload."""
        with self._lock:
            for replica, redactor in self._redactors.items():
                held = redactor.flush()
                if held:
                    self._write(replica, held)
            self._close_files()  # opened again by the next append, if one comes
        self._upload()

    def _upload(self) -> None:
        if self._local:
            return
        with self._lock:
            dirty, self._dirty = sorted(self._dirty), set()
            self._last_flush = time.monotonic()
            for replica in dirty:
                fsx.atomic_write(self.log_url(replica), _spool_read(self._spool, replica_log_name(replica)))

    def placed(self, engine_jobs: list[str] | tuple[str, ...]) -> None:
        """Record where the replicas were placed (their engine job ids), while the attempt runs."""
        self.record = replace(self.record, engine_jobs=tuple(str(job) for job in engine_jobs))
        self._write_record()

    def _write_record(self) -> None:
        """Write ``attempt.json`` as the record stands (its folder is made if missing)."""
        if self._record_pending and self._local:
            _make_local_folder(fsx.filesystem(self.url)[1])  # a deferred attempt's folder: not there yet
        fsx.atomic_write(fsx.join(self.url, RECORD_FILE), self.record.to_json(), durable=self.durable)
        self._record_pending = False

    def finish(self, outcome: AttemptOutcome, reason: str = "", exit_codes: tuple[int | None, ...] | list = ()) -> AttemptRecord:
        self.flush()
        self.record = replace(self.record, ended_at=time.time(), outcome=outcome.value, reason=reason,
                              exit_codes=tuple(exit_codes))
        self._write_record()
        if self._spool is not None:
            _spool_remove(self._spool)
        return self.record


def _make_local_folder(path: str) -> None:
    """Make the attempt folder ``path`` if missing: usually two calls (``.attempts`` above it, then it)."""
    try:
        os.mkdir(os.path.dirname(path))
    except FileExistsError:
        pass
    except FileNotFoundError:  # the work's own folder is missing too
        os.makedirs(path, exist_ok=True)
        return
    try:
        os.mkdir(path)
    except FileExistsError:
        pass


# The spool is a temporary folder of this machine holding a remote attempt's logs whole between uploads.


def _spool_read(spool: str, name: str) -> bytes:
    with open(os.path.join(spool, name), "rb") as handle:
        return handle.read()


def _spool_remove(spool: str) -> None:
    import shutil

    shutil.rmtree(spool, ignore_errors=True)


def _log_writer(folder: str, record: AttemptRecord) -> AttemptLog:
    return AttemptLog(folder, record, create_logs=False)


# -- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptListing:
    """One attempt as a reader finds it: its record (None when unreadable) and its replicas' log URLs.

    ``problem`` says why a record that is there was not read (not a regular file, too large, a link
    out of the folder the reader keeps to)."""

    attempt: int
    url: str
    record: AttemptRecord | None
    logs: tuple[str, ...]
    problem: str = ""

    def describe(self) -> str:
        """``attempt 2 (job train-...-3f2a, attempt 2 on slurm): PREEMPTED exit 75 after 41.2s: reason``."""
        record = self.record
        if record is None:
            return f"attempt {self.attempt}: no readable {RECORD_FILE}" + (f" ({self.problem})" if self.problem else "")
        where = f" (iris job {record.job_id}, its attempt {record.job_attempt}, on {record.engine})" if record.job_id else f" ({record.engine})"
        if not record.finished:
            return f"attempt {self.attempt}{where}: RUNNING (or its runner died) since {_clock(record.started_at)}"
        codes = ", ".join("?" if code is None else str(code) for code in record.exit_codes)
        took = (record.ended_at or record.started_at) - record.started_at
        text = f"attempt {self.attempt}{where}: {record.outcome} (exit {codes or '-'}) after {took:.1f}s"
        return text + (f": {record.reason}" if record.reason else "")


def _outcome_of(record: AttemptRecord) -> AttemptOutcome | None:
    try:
        return AttemptOutcome(record.outcome) if record.outcome else None
    except ValueError:  # written by a newer iris: counted as an attempt, not as any kind
        return None


def _clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _read_record(url: str, within: str | None = None) -> tuple[AttemptRecord | None, str]:
    """``(record, problem)``: a record that is a FIFO, a device, too large or outside ``within`` is not read."""
    try:
        text = read_bounded_text(fsx.join(url, RECORD_FILE), within=within)
        return (AttemptRecord.from_json(text) if text is not None else None), ""
    except RefusedFileError as exc:
        return None, str(exc)
    except (ValueError, TypeError, KeyError):
        return None, ""


def list_attempts(folder: str, *, within: str | None = None) -> list[AttemptListing]:
    """Every attempt kept under ``folder``, oldest first; with ``within``, one that leads out of that
    folder through a link is listed as refused, unread."""
    listings = []
    for number in _attempt_numbers(folder):
        url = attempt_url(folder, number)
        try:
            check_within(within, url)
        except RefusedFileError as exc:
            listings.append(AttemptListing(number, url, None, (), str(exc)))
            continue
        record, problem = _read_record(url, within)
        try:
            names = sorted(str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in fsx.ls(url))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        logs = tuple(fsx.join(url, name) for name in names if name.startswith("replica-") and name.endswith(".log"))
        listings.append(AttemptListing(number, url, record, logs, problem))
    return listings


def attempt_records(folder: str) -> list[AttemptRecord]:
    """The readable records of every attempt kept under ``folder``, oldest first (without listing their logs)."""
    records = (_read_record(attempt_url(folder, number))[0] for number in _attempt_numbers(folder))
    return [record for record in records if record is not None]


@dataclass(frozen=True)
class AttemptTally:
    """How a step's (or job's) attempts ended, counted: what ``marin status`` and a run's summary show."""

    attempts: int = 0
    preempted: int = 0
    failed: int = 0  # FAILED or TIMED_OUT: the attempts that spent a failure budget
    stopped: int = 0
    running: int = 0  # no outcome yet (or its writer died)

    @classmethod
    def of(cls, records: Iterable[AttemptRecord]) -> AttemptTally:
        outcomes = [_outcome_of(record) for record in records]
        return cls(
            attempts=len(outcomes),
            preempted=outcomes.count(AttemptOutcome.PREEMPTED),
            failed=sum(1 for outcome in outcomes if outcome is not None and outcome.spends_failure_budget),
            stopped=outcomes.count(AttemptOutcome.STOPPED),
            running=outcomes.count(None),
        )

    @property
    def eventful(self) -> bool:
        """Worth telling: more than one attempt, or one that was preempted."""
        return self.attempts > 1 or self.preempted > 0

    def describe(self) -> str:
        """``3 attempts, 2 preempted``; ``2 attempts, 1 preempted, 1 failed``."""
        parts = [f"{self.attempts} attempt{'s' if self.attempts != 1 else ''}"]
        for count, word in ((self.preempted, "preempted"), (self.failed, "failed"), (self.stopped, "stopped")):
            if count:
                parts.append(f"{count} {word}")
        return ", ".join(parts)


def read_log(url: str, offset: int = 0, limit: int | None = None) -> bytes:
    """Bytes of one replica log from ``offset`` (at most ``limit``); empty when it does not exist (yet).

    :class:`~rigging.regular_files.RefusedFileError` when it is no regular file (a FIFO would block).
    """
    try:
        with open_regular(url) as handle:
            handle.seek(offset)
            return handle.read() if limit is None else handle.read(limit)
    except FileNotFoundError:
        return b""


def as_dict(listing: AttemptListing) -> dict[str, Any]:
    """A listing as plain JSON data (for ``--json`` output and the web view's API)."""
    record = asdict(listing.record) if listing.record is not None else None
    if record is not None:
        record["exit_codes"] = list(listing.record.exit_codes)
    return {"attempt": listing.attempt, "url": listing.url, "record": record, "logs": list(listing.logs),
            "problem": listing.problem}
