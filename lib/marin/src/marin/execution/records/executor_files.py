"""The files the runner keeps in each step's output folder, and how to read them.

``.executor_info``   JSON: what ran (name, identity, version, hash attributes, function and its code
                     fingerprint, git commit, dependency names/identities/locations, resources).
                     Written before the step starts.
``.executor_status`` JSON: ``{"status": ..., "time": ..., "holder": ..., "error": ..., "identity": ...,
                     "code": ..., "attempt": ..., "job": ...}`` where status is RUNNING, SUCCESS, FAILED or
                     DEP_FAILED; ``attempt`` numbers the step's attempt folder (``.attempts/NNN``) and
                     ``job`` is the iris job running it, if any. SUCCESS is written last. The status carries the full identity it is about, so that the file
                     that says "done" also says done *what*: reuse never depends on another file.
                     It is also the step's fenced ownership record (:mod:`rigging.fencing`): ``generation``
                     and ``owner`` name the one execution that may write it and commit the step's
                     output, ``staging`` the folder that execution writes into, ``committing`` that its
                     output is being moved into place (see :mod:`marin.execution.ownership.step_ownership`).
``.executor_lock``   the lease (see :mod:`rigging.lease`): who is running the step right now.
``.artifact.json``   the step's typed result and provenance (see :mod:`marin.execution.artifact`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError, read_bounded_text
from rigging.secrets import redact, secret_values

from marin.errors import MarinError

INFO_FILE = ".executor_info"
STATUS_FILE = ".executor_status"
LOCK_FILE = ".executor_lock"
ARTIFACT_FILE = ".artifact.json"

STATUS_RUNNING = "RUNNING"
STATUS_SUCCESS = "SUCCESS"
STATUS_FAILED = "FAILED"
STATUS_DEP_FAILED = "DEP_FAILED"
ALL_STATUSES = (STATUS_RUNNING, STATUS_SUCCESS, STATUS_FAILED, STATUS_DEP_FAILED)


@dataclass(frozen=True)
class StatusRecord:
    """``identity``: the full identity of the step this status is about (None in records of older
    runners); ``code``: the fingerprint digest of the function that made it (see code_fingerprint);
    ``attempt``: the number of its attempt folder under ``.attempts/``; ``job``: the iris job id
    when the step runs (or ran) as an iris job."""

    status: str
    time: float
    holder: str | None = None
    error: str | None = None
    identity: str | None = None
    code: str | None = None
    attempt: int | None = None
    job: str | None = None
    generation: int = 0
    owner: str | None = None
    staging: str | None = None
    committing: bool = False
    engine: str | None = None  # the iris engine setting the job runs on
    iris_home: str | None = None  # the iris database the job is recorded in

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1)


def _record_text(url: str, within: str | None) -> str | None:
    """A record's text: ``None`` when absent; :class:`CorruptRecordError` when it is no regular file
    (a FIFO, a device), lies outside ``within`` or is implausibly large, since such a file is never
    read (see :mod:`rigging.regular_files`)."""
    try:
        return read_bounded_text(url, within=within)
    except RefusedFileError as exc:
        raise CorruptRecordError(str(exc)) from exc


def read_status(output_path: str, *, strict: bool = False, within: str | None = None) -> StatusRecord | None:
    """The step's status record, or ``None`` when it never started (or the file is unreadable).

    With ``strict``, a file that is there but unreadable raises :class:`CorruptRecordError` naming it;
    with ``within``, a link out of that folder is such a file.
    """
    url = fsx.join(output_path, STATUS_FILE)
    try:
        text = _record_text(url, within)
    except CorruptRecordError:
        if strict:
            raise
        return None
    if text is None:
        return None
    try:
        return status_from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # A bare word is accepted too, so a hand-edited status file still reads.
        word = text.strip()
        if word in ALL_STATUSES:
            return StatusRecord(word, 0.0)
        if strict:
            raise CorruptRecordError(f"{url} is corrupt ({type(exc).__name__}: {exc})") from exc
        return None


def status_from_dict(data: dict[str, Any]) -> StatusRecord:
    """A status record from its JSON fields; fields of the wrong type read as absent."""

    def text(name: str) -> str | None:
        value = data.get(name)
        return value if isinstance(value, str) else None

    def number(name: str) -> int | None:
        value = data.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return StatusRecord(
        data["status"],
        float(data.get("time", 0.0)),
        data.get("holder"),
        data.get("error"),
        data.get("identity"),
        data.get("code"),
        number("attempt"),
        text("job"),
        number("generation") or 0,
        text("owner"),
        text("staging"),
        data.get("committing") is True,
        text("engine"),
        text("iris_home"),
    )


def status_url(output_path: str) -> str:
    return fsx.join(output_path, STATUS_FILE)


def write_status(
    output_path: str,
    status: str,
    *,
    holder: str | None = None,
    error: str | None = None,
    identity: str | None = None,
    code: str | None = None,
    attempt: int | None = None,
    job: str | None = None,
) -> StatusRecord:
    record = StatusRecord(status, time.time(), holder, error, identity, code, attempt, job)
    fsx.atomic_write(fsx.join(output_path, STATUS_FILE), record.to_json())
    return record


class CorruptRecordError(MarinError, ValueError):
    """One of the runner's own files in a step folder exists but cannot be read as JSON."""


def read_info(output_path: str, *, strict: bool = False, within: str | None = None) -> dict[str, Any] | None:
    """``.executor_info`` as a dict; ``None`` when it is missing, or unreadable unless ``strict``.

    With ``strict``, an unreadable file raises :class:`CorruptRecordError` naming it, for callers
    that must tell "no record" from "a record that was damaged"; with ``within``, a link out of that
    folder is such a file.
    """
    url = fsx.join(output_path, INFO_FILE)
    try:
        text = _record_text(url, within)
    except CorruptRecordError:
        if strict:
            raise
        return None
    if text is None:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        return data
    except ValueError as exc:
        if strict:
            raise CorruptRecordError(f"{url} is corrupt ({exc}); the step's record of what ran is lost.") from exc
        return None


def recorded_identity(output_path: str, status: StatusRecord | None) -> str | None:
    """The full identity the folder's records name: the status's own, else ``.executor_info``'s."""
    if status is not None and status.identity:
        return status.identity
    info = read_info(output_path)
    identity = info.get("identity") if info else None
    return identity if isinstance(identity, str) and identity else None


def step_location(output_path: str, prefix: str) -> str | None:
    """``output_path`` relative to ``prefix`` (``None`` when it lies elsewhere)."""
    root = prefix.rstrip("/")
    if output_path.startswith(root + "/"):
        return output_path[len(root) + 1 :]
    return None


def prefix_of(output_path: str, info: dict[str, Any] | None) -> str | None:
    """The prefix ``output_path`` lies under *now*, from the location its ``.executor_info`` records.

    The prefix as it was when the step ran may have been moved or copied since; the step's place
    inside it has not.
    """
    location = (info or {}).get("location")
    if isinstance(location, str) and location and output_path.rstrip("/").endswith("/" + location):
        return output_path.rstrip("/")[: -len(location) - 1]
    return None


def recorded_dependency_paths(output_path: str, info: dict[str, Any] | None) -> list[tuple[dict[str, Any], str | None]]:
    """Each recorded dependency with its output path resolved against the prefix as it is now.

    Falls back to the path recorded when the step ran for steps outside any prefix.
    """
    prefix = prefix_of(output_path, info)
    resolved = []
    for dep in (info or {}).get("deps") or []:
        location = dep.get("location")
        path = fsx.join(prefix, location) if prefix and location else dep.get("output_path")
        resolved.append((dep, path))
    return resolved


def write_info(output_path: str, info: dict[str, Any]) -> None:
    # A config may carry a credential the environment also holds (a W&B key copied into it): the
    # record says what ran, and keeps that value out.
    text = redact(json.dumps(info, indent=2, sort_keys=True, default=str), secret_values())
    fsx.atomic_write(fsx.join(output_path, INFO_FILE), text)
