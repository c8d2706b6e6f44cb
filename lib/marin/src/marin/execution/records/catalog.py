"""Find the step folders under a prefix and read what they say (for ``marin status``/``explain``)."""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass

from iris.attempt_log import AttemptTally, attempt_records
from rigging import filesystem as fsx

from marin.execution.hashing.code_fingerprint import CodeFingerprint, comparable, fingerprint_from_source
from marin.execution.records.executor_files import (
    INFO_FILE,
    STATUS_FILE,
    STATUS_SUCCESS,
    CorruptRecordError,
    read_info,
    read_status,
)

MAX_DEPTH = 8
_HASHED_FOLDER = re.compile(r"^(?P<name>.+)-(?P<hash>[0-9a-f]{8})$")


@dataclass(frozen=True)
class StepListing:
    name: str
    output_path: str
    status: str | None
    status_time: float | None
    identity: str | None
    # True when the function's source file now holds other code than what made this output;
    # None when that cannot be told (no record, file gone, another Python).
    code_changed: bool | None = None
    # The step's attempt folder (.attempts/NNN) and iris job, as its status records them.
    attempt: int | None = None
    job: str | None = None
    # Every attempt kept in the folder (.attempts/), counted by how it ended: preemptions iris retried
    # leave no other trace in the status. None when not read (it costs a read per attempt).
    attempts: AttemptTally | None = None
    # Why a record in the folder was not read (damaged, not a regular file, too large): shown, not hidden.
    problems: tuple[str, ...] = ()

    def age_text(self, now: float | None = None) -> str:
        if not self.status_time:
            return "-"
        seconds = max(0.0, (now or time.time()) - self.status_time)
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size:
                return f"{seconds / size:.0f}{unit}"
        return f"{seconds:.0f}s"


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _spelled_like(url: str, root: str, path: str) -> str:
    """``path`` (inside the filesystem of ``url``, whose own path there is ``root``) spelled like ``url``.

    fsspec lists paths without their protocol and, for some filesystems, with a leading slash the
    user never wrote (``memory://a`` lists ``/a/b``); outputs are shown and compared as the runner
    names them, so each is rebuilt from the URL it was found under.
    """
    if "://" not in url or url.startswith("file://"):
        return path
    root = root.rstrip("/")
    if path == root or path.startswith(root + "/"):
        return url.rstrip("/") + path[len(root):]
    return url.split("://", 1)[0] + "://" + path.lstrip("/")


def step_folders(prefix: str, *, links: list[str] | None = None) -> list[str]:
    """Output folders under ``prefix`` (a folder with ``.executor_info`` or ``.executor_status``).

    The walk does not descend into step folders: their contents (checkpoints, caches) can be huge.
    Nor does it follow links (fsspec lists one as "other"): given ``links``, the links it passed
    over are appended to it, for a reader that must say what it left out.
    """
    fs, root = fsx.filesystem(prefix)
    if not fs.exists(root):
        return []
    found: list[str] = []
    frontier = [(root, 0)]
    while frontier:
        folder, depth = frontier.pop()
        try:
            entries = fs.ls(folder, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        names = {_basename(e["name"]) for e in entries}
        if INFO_FILE in names or STATUS_FILE in names:
            found.append(_spelled_like(prefix, root, folder))
            continue
        if depth >= MAX_DEPTH:
            continue
        for entry in entries:
            if entry.get("type") == "directory" and not _basename(entry["name"]).startswith("."):
                frontier.append((entry["name"], depth + 1))
            elif links is not None and entry.get("islink") and not _basename(entry["name"]).startswith("."):
                links.append(_spelled_like(prefix, root, entry["name"]))
    return sorted(found)


def describe_folder(output_path: str, prefix: str | None = None, *, with_attempts: bool = False) -> StepListing:
    problems = []
    try:
        info = read_info(output_path, strict=True) or {}
    except CorruptRecordError as exc:
        info = {}
        problems.append(str(exc))
    try:
        status = read_status(output_path, strict=True)
    except CorruptRecordError as exc:
        status = None
        problems.append(str(exc))
    name = info.get("name")
    if name is None:
        relative = output_path[len(prefix) :].strip("/") if prefix and output_path.startswith(prefix) else _basename(output_path)
        match = _HASHED_FOLDER.match(relative)
        name = match["name"] if match else relative
    code_changed = None
    if status is not None and status.status == STATUS_SUCCESS:
        code_changed = _code_changed(info, status.code)
    return StepListing(
        name=name,
        output_path=output_path,
        status=status.status if status else None,
        status_time=status.time if status else None,
        identity=info.get("identity"),
        code_changed=code_changed,
        attempt=status.attempt if status else None,
        job=status.job if status else None,
        attempts=AttemptTally.of(attempt_records(output_path)) if with_attempts else None,
        problems=tuple(problems),
    )


def _code_changed(info: dict, recorded_digest: str | None) -> bool | None:
    """Compare the recorded code fingerprint with the function's source file as it is now (no import)."""
    recorded = CodeFingerprint.from_json(info.get("code"))
    if recorded is None:
        return None
    digest = recorded_digest or recorded.digest
    if not _is_regular_file(recorded.file):
        return None  # the record may name anything; a FIFO there would stop the listing for good
    current = fingerprint_from_source(recorded.file, recorded.qualname, recorded.line)
    if not comparable(digest, current):
        return None
    return current != digest


def _is_regular_file(path: str | None) -> bool:
    try:
        return bool(path) and stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _is_step_folder(folder: str) -> bool:
    # By the files' presence, not their contents: a damaged record must be reported, not hidden.
    return fsx.exists(fsx.join(folder, INFO_FILE)) or fsx.exists(fsx.join(folder, STATUS_FILE))


def list_steps(prefix: str, *, with_attempts: bool = False) -> list[StepListing]:
    return [describe_folder(folder, prefix, with_attempts=with_attempts) for folder in step_folders(prefix)]


def find_step_folders(prefix: str, name_or_path: str) -> list[str]:
    """Folders matching a path, a path relative to ``prefix``, or a step name (any hash), newest first."""
    candidates = [name_or_path] if ("://" in name_or_path or name_or_path.startswith("/")) else []
    candidates.append(fsx.join(prefix, name_or_path))
    for candidate in candidates:
        if _is_step_folder(candidate):
            return [candidate]
    parent_rel, _, base = name_or_path.rstrip("/").rpartition("/")
    parent = fsx.join(prefix, parent_rel) if parent_rel else prefix
    fs, root = fsx.filesystem(parent)
    if not fs.isdir(root):
        return []
    matches = []
    for entry in fs.ls(root, detail=False):
        match = _HASHED_FOLDER.match(_basename(entry))
        folder = _spelled_like(parent, root, entry)
        if match and match["name"] == base and _is_step_folder(folder):
            matches.append(folder)
    listings = [describe_folder(m, prefix) for m in matches]
    listings.sort(key=lambda listing: listing.status_time or 0.0, reverse=True)
    return [listing.output_path for listing in listings]


def closest_step_names(prefix: str, what: str, limit: int = 3) -> list[str]:
    """Step names and folders (relative to ``prefix``) spelled most like ``what``, for "did you mean"."""
    import difflib

    known: set[str] = set()
    for listing in list_steps(prefix):
        known.add(listing.name)
        relative = listing.output_path[len(prefix) :].strip("/") if listing.output_path.startswith(prefix) else None
        if relative:
            known.add(relative)
    return difflib.get_close_matches(what.strip("/"), sorted(known), n=limit, cutoff=0.5)
