"""A step's attempts as the view shows them, and windows of their replica logs.

Attempts are read from the step's own folder (:mod:`iris.attempt_log`), so the view shows every
attempt whichever engine ran it. A log is never read whole: a page is a window of at most
:data:`LOG_WINDOW_BYTES`, by default the log's tail, and pages back (``before``) or on (``offset``)
from there. Windows start and end on UTF-8 character boundaries, so paging and following never
show a torn character, and the next window starts exactly where the last one ended. Nothing
outside the prefix is read: an attempt folder or record that is a link out of it is listed as
refused, and a log that is no regular file (a FIFO would never answer) is refused, not waited on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from iris.attempt_log import ATTEMPTS_FOLDER, AttemptListing, list_attempts, read_log, replica_log_name
from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError

from marin.serve.errors import NotFoundError, UnreadableError
from marin.serve.paths import resolve
from marin.serve.steps import step_folder

LOG_WINDOW_BYTES = 64 * 1024
MAX_WINDOW_BYTES = 1 << 20  # the most a request may ask for


@dataclass(frozen=True)
class AttemptRow:
    """One attempt, as the step page's table and ``/api/attempts`` show it."""

    attempt: int
    outcome: str  # an AttemptOutcome value, RUNNING while it has none, UNREADABLE without a record
    engine: str | None
    job_id: str | None
    job_attempt: int | None
    exit_codes: tuple[int | None, ...]
    started_at: float | None
    duration_seconds: float | None
    reason: str
    description: str  # AttemptListing.describe(): the line `marin logs` prints
    replicas: tuple[int, ...]  # replica numbers that have a log
    engine_jobs: tuple[str, ...] = ()  # each replica's job id on the engine (a Slurm batch job id)

    @property
    def finished(self) -> bool:
        return self.outcome not in ("RUNNING", "UNREADABLE")

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "exit_codes": list(self.exit_codes), "replicas": list(self.replicas),
                "engine_jobs": list(self.engine_jobs), "finished": self.finished}


def _row(listing: AttemptListing, now: float) -> AttemptRow:
    record = listing.record
    replicas = tuple(sorted(_replica_number(url) for url in listing.logs))
    if record is None:
        return AttemptRow(listing.attempt, "UNREADABLE", None, None, None, (), None, None, listing.problem, listing.describe(),
                          replicas)
    end = record.ended_at if record.finished else now
    return AttemptRow(
        attempt=listing.attempt,
        outcome=record.outcome or "RUNNING",
        engine=record.engine,
        job_id=record.job_id,
        job_attempt=record.job_attempt,
        exit_codes=tuple(record.exit_codes),
        started_at=record.started_at,
        duration_seconds=None if end is None else max(0.0, end - record.started_at),
        reason=record.reason,
        description=listing.describe(),
        replicas=replicas,
        engine_jobs=tuple(record.engine_jobs),
    )


def _replica_number(url: str) -> int:
    digits = url.rstrip("/").rsplit("/", 1)[-1].removeprefix("replica-").removesuffix(".log")
    return int(digits) if digits.isdigit() else -1


def step_attempts(prefix: str, path: str) -> list[AttemptRow]:
    """The attempts kept in the step at ``path`` (relative to the prefix), oldest first."""
    folder = step_folder(prefix, path)
    resolve(prefix, f"{path}/{ATTEMPTS_FOLDER}")  # refused if it is a link out of the prefix
    now = time.time()
    return [_row(listing, now) for listing in list_attempts(folder, within=prefix)]


@dataclass(frozen=True)
class LogWindow:
    text: str
    start: int  # byte offset of the window's first byte in the log
    end: int  # byte offset just after its last
    size: int  # the log's size when it was read

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "start": self.start, "end": self.end, "size": self.size}


def log_url(prefix: str, path: str, attempt: int, replica: int) -> str:
    """The URL of one replica's log, checked to lie in the prefix; :class:`NotFoundError` when absent."""
    step_folder(prefix, path)
    if attempt < 1 or replica < 0:
        raise NotFoundError(f"no attempt {attempt}, replica {replica}: attempts count from 1, replicas from 0")
    url = resolve(prefix, f"{path}/{ATTEMPTS_FOLDER}/{attempt:03d}/{replica_log_name(replica)}")
    if not fsx.exists(url):
        raise NotFoundError(f"{path!r} has no log for attempt {attempt}, replica {replica}")
    return url


def read_window(url: str, *, offset: int | None = None, before: int | None = None, limit: int = LOG_WINDOW_BYTES) -> LogWindow:
    """At most ``limit`` bytes of the log: from ``offset`` on, or ending at ``before``, or its tail."""
    limit = max(1, min(MAX_WINDOW_BYTES, int(limit)))
    try:
        return _read_window(url, offset, before, limit)
    except RefusedFileError as exc:
        raise UnreadableError(str(exc)) from exc


def _read_window(url: str, offset: int | None, before: int | None, limit: int) -> LogWindow:
    fs, path = fsx.filesystem(url)
    try:
        size = int(fs.size(path) or 0)
    except FileNotFoundError:
        size = 0
    if offset is not None:
        start = min(max(0, int(offset)), size)
        data = read_log(url, start, limit)
        data = data[: _complete_length(data)]
        return LogWindow(data.decode("utf-8", errors="replace"), start, start + len(data), max(size, start + len(data)))
    end = size if before is None else min(max(0, int(before)), size)
    start = max(0, end - limit)
    data = read_log(url, start, end - start)
    skip = _continuation_length(data) if start > 0 else 0
    data = data[skip:]
    data = data[: _complete_length(data)]
    return LogWindow(data.decode("utf-8", errors="replace"), start + skip, start + skip + len(data), size)


def _continuation_length(data: bytes) -> int:
    """How many bytes at the start belong to a character that began before the window (at most 3)."""
    count = 0
    while count < min(3, len(data)) and data[count] & 0xC0 == 0x80:
        count += 1
    return count


def _complete_length(data: bytes) -> int:
    """``len(data)`` less a trailing character whose bytes have not all arrived yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the character's first byte
        need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return len(data) if back >= need else len(data) - back
    return len(data)
