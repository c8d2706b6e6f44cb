"""Durable job state: one SQLite database, logs in files beside it.

Every process that touches a job (the CLI, the job's supervisor) opens short connections to the
same database, so a restarted ``iris`` sees every earlier job with its final state. WAL mode lets
readers (``iris job list``) run while a supervisor writes.
"""

from __future__ import annotations

import enum
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rigging.config.discovery import discover_config
from rigging.names import UnsafeNameError, check_relative_name

from iris.errors import IrisError
from iris.spec import InvalidJobSpec, JobSpec

IRIS_HOME_VARIABLE = "IRIS_HOME"


class IrisHomeError(IrisError, ValueError):
    """The folder for iris's database cannot be used."""


class JobDatabaseError(IrisHomeError):
    """``jobs.db`` exists but SQLite cannot read it as a database (damaged, or some other file)."""


class JobState(enum.Enum):
    PENDING = "PENDING"  # recorded, supervisor not started yet
    RUNNING = "RUNNING"  # an attempt is running
    RETRYING = "RETRYING"  # the last attempt was preempted or failed, and its budget allows another
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    spec: JobSpec
    state: JobState
    created_at: float
    updated_at: float
    attempts: int
    preemptions: int
    failures: int
    exit_code: int | None
    message: str
    supervisor_pid: int | None
    stop_requested: bool
    # Where the supervisor runs when the engine keeps it (a JSON locator of the fray job that runs
    # it, see iris.placement); None: a process of the machine that submitted the job.
    supervisor_job: str | None = None


@dataclass(frozen=True)
class AttemptRecord:
    attempt: int
    started_at: float
    ended_at: float | None
    outcome: str | None  # an iris.attempt_log.AttemptOutcome value: SUCCEEDED, PREEMPTED, FAILED, TIMED_OUT, STOPPED
    exit_codes: tuple[int | None, ...]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    preemptions INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    message TEXT NOT NULL DEFAULT '',
    supervisor_pid INTEGER,
    stop_requested INTEGER NOT NULL DEFAULT 0,
    supervisor_job TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    outcome TEXT,
    exit_codes TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL
);
"""


def default_home() -> Path:
    """``$IRIS_HOME``, else ``<Marin prefix>/.iris``; the prefix must be a local folder."""
    explicit = os.environ.get(IRIS_HOME_VARIABLE)
    if explicit:
        return Path(explicit).expanduser().resolve()
    # Only a local prefix is used, so whether a remote one's filesystem is installed does not matter here.
    prefix = discover_config(check_prefix=False).prefix
    if "://" in prefix:
        raise IrisHomeError(
            f"The Marin prefix {prefix!r} is remote, and iris keeps its job database on a local disk. "
            f"Set {IRIS_HOME_VARIABLE} to a local folder, e.g. `export {IRIS_HOME_VARIABLE}=~/.iris`."
        )
    return Path(prefix) / ".iris"


class JobStore:
    """The job database at ``<home>/jobs.db`` and the log folders at ``<home>/logs/<job_id>/``."""

    def __init__(self, home: str | os.PathLike | None = None, *, create: bool = True) -> None:
        """``create=False`` is for reading: where there is no database yet, nothing is created and
        the store reads as empty (``iris job list`` must not leave folders behind)."""
        self.home = Path(home).resolve() if home is not None else default_home()
        self.db_path = self.home / "jobs.db"
        self._absent = not create and not self.db_path.exists()
        if self._absent:
            return
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IrisHomeError(f"Cannot create iris's folder {self.home}: {exc}. Set {IRIS_HOME_VARIABLE} to a writable folder.") from exc
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            # A database made before supervisors could run on the engine lacks the column.
            columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)").fetchall()}
            if "supervisor_job" not in columns:
                db.execute("ALTER TABLE jobs ADD COLUMN supervisor_job TEXT")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # A generous busy timeout: a supervisor and several CLI calls may write at once. A store
        # opened for reading where no database exists is an empty one in memory.
        db = sqlite3.connect(":memory:" if self._absent else self.db_path, timeout=30)
        if self._absent:
            db.executescript(_SCHEMA)
        try:
            with db:
                yield db
        except sqlite3.DatabaseError as exc:
            # SQLite reports a file it cannot read (SQLITE_NOTADB, SQLITE_CORRUPT) as a plain
            # DatabaseError; its subclasses (locked, constraint failed...) say nothing about the file.
            if type(exc) is not sqlite3.DatabaseError:
                raise
            raise JobDatabaseError(
                f"iris's job database {self.db_path} cannot be read ({exc}): it is damaged or not an SQLite "
                f"file. Move it aside (mv {self.db_path} {self.db_path}.broken) and iris starts a new, empty one; "
                f"the jobs' logs stay in {self.home / 'logs'}. Or point {IRIS_HOME_VARIABLE} (--home) elsewhere."
            ) from exc
        finally:
            db.close()

    def log_folder(self, job_id: str) -> Path:
        # Job ids come from the command line too; one must never name a folder outside the home.
        try:
            check_relative_name(job_id, what="Job id")
        except UnsafeNameError as exc:
            raise InvalidJobSpec(str(exc)) from None
        return self.home / "logs" / job_id

    # -- writes ------------------------------------------------------------------------------------

    def create(self, job_id: str, spec: JobSpec) -> None:
        now = time.time()
        with self._connect() as db:
            db.execute(
                "INSERT INTO jobs (job_id, spec, state, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                (job_id, spec.to_json(), JobState.PENDING.value, now, now),
            )
            db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (job_id, now, JobState.PENDING.value, "submitted"))

    def transition(self, job_id: str, state: JobState, message: str = "", *, exit_code: int | None = None) -> None:
        """Move a job to ``state``; a finished job never changes again (a late writer loses)."""
        now = time.time()
        finished = tuple(s.value for s in JobState if s.finished)
        with self._connect() as db:
            cursor = db.execute(
                f"UPDATE jobs SET state = ?, updated_at = ?, message = ?, exit_code = COALESCE(?, exit_code) "
                f"WHERE job_id = ? AND state NOT IN ({','.join('?' * len(finished))})",
                (state.value, now, message, exit_code, job_id, *finished),
            )
            if cursor.rowcount:
                db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (job_id, now, state.value, message))

    def set_supervisor(self, job_id: str, pid: int) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET supervisor_pid = ? WHERE job_id = ?", (pid, job_id))

    def set_supervisor_job(self, job_id: str, locator: str) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET supervisor_job = ? WHERE job_id = ?", (locator, job_id))

    def request_stop(self, job_id: str) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET stop_requested = 1 WHERE job_id = ?", (job_id,))

    def start_attempt(self, job_id: str, attempt: int) -> None:
        now = time.time()
        with self._connect() as db:
            db.execute("INSERT INTO attempts (job_id, attempt, started_at) VALUES (?, ?, ?)", (job_id, attempt, now))
            db.execute("UPDATE jobs SET attempts = ?, updated_at = ? WHERE job_id = ?", (attempt, now, job_id))

    def end_attempt(self, job_id: str, attempt: int, outcome: str, exit_codes: list[int | None]) -> None:
        column = {"PREEMPTED": "preemptions", "FAILED": "failures", "TIMED_OUT": "failures"}.get(outcome)
        with self._connect() as db:
            db.execute(
                "UPDATE attempts SET ended_at = ?, outcome = ?, exit_codes = ? WHERE job_id = ? AND attempt = ?",
                (time.time(), outcome, json.dumps(exit_codes), job_id, attempt),
            )
            if column:
                db.execute(f"UPDATE jobs SET {column} = {column} + 1 WHERE job_id = ?", (job_id,))

    # -- reads -------------------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _job_from_row(row) if row else None

    def all(self) -> list[JobRecord]:
        with self._connect() as db:
            rows = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY created_at").fetchall()
        return [_job_from_row(row) for row in rows]

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT attempt, started_at, ended_at, outcome, exit_codes FROM attempts WHERE job_id = ? ORDER BY attempt",
                (job_id,),
            ).fetchall()
        return [AttemptRecord(a, s, e, o, tuple(json.loads(c))) for a, s, e, o, c in rows]

    def events(self, job_id: str) -> list[tuple[float, str, str]]:
        with self._connect() as db:
            return db.execute("SELECT at, state, message FROM events WHERE job_id = ? ORDER BY rowid", (job_id,)).fetchall()


_JOB_COLUMNS = (
    "job_id, spec, state, created_at, updated_at, attempts, preemptions, failures, exit_code, message, "
    "supervisor_pid, stop_requested, supervisor_job"
)


def _job_from_row(row: tuple) -> JobRecord:
    job_id, spec, state, created, updated, attempts, preemptions, failures, exit_code, message, pid, stop, placed = row
    return JobRecord(
        job_id=job_id,
        spec=JobSpec.from_json(spec),
        state=JobState(state),
        created_at=created,
        updated_at=updated,
        attempts=attempts,
        preemptions=preemptions,
        failures=failures,
        exit_code=exit_code,
        message=message,
        supervisor_pid=pid,
        stop_requested=bool(stop),
        supervisor_job=placed,
    )
