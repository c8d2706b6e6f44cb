"""The steps under a prefix as the view shows them: one row per output folder, and one step's details.

Rows come from the files the runner keeps (see :mod:`marin.execution.records.executor_files`). A step's
duration is the time between its ``.executor_info`` being written (just before it starts) and its
last status; while it runs, the time since then.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError, read_bounded_text

from marin.execution.records.catalog import step_folders
from marin.execution.records.executor_files import (
    ARTIFACT_FILE,
    INFO_FILE,
    STATUS_RUNNING,
    CorruptRecordError,
    read_info,
    read_status,
    recorded_dependency_paths,
)
from marin.execution.reproducibility.explain import identity_differences
from marin.serve.errors import NotFoundError, UnreadableError
from marin.serve.paths import relative_to, resolve

# Reading two small files per folder is latency-bound (object stores especially), not CPU-bound.
_READERS = 16


@dataclass(frozen=True)
class StepRow:
    name: str
    path: str  # relative to the prefix: what links carry
    status: str | None
    status_time: float | None
    started: float | None
    identity: str | None
    version: str | None
    error: str | None
    record_damaged: bool
    problems: tuple[str, ...] = ()  # each record not read, naming it and why (damaged, a FIFO, too large...)
    # A digest of the hash attributes: outputs of one name with the same digest are the same
    # configuration run again (another version, code or input data); others are other experiments.
    configuration: str | None = None

    @property
    def short_hash(self) -> str:
        return (self.identity or "")[:8]

    def duration(self, now: float | None = None) -> float | None:
        if self.started is None:
            return None
        end = (now or time.time()) if self.status == STATUS_RUNNING else self.status_time
        return None if end is None else max(0.0, end - self.started)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = now or time.time()
        return {
            **asdict(self),
            "short_hash": self.short_hash,
            "age_seconds": None if self.status_time is None else max(0.0, now - self.status_time),
            "duration_seconds": self.duration(now),
        }


def _mtime(fs: Any, path: str) -> float | None:
    try:
        info = fs.info(path)
    except (FileNotFoundError, OSError):
        return None
    value = info.get("mtime") or info.get("LastModified") or info.get("updated") or info.get("created")
    if hasattr(value, "timestamp"):
        return value.timestamp()
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def read_row(prefix: str, folder: str) -> StepRow:
    relative = relative_to(prefix, folder) or folder
    damaged, problems = False, []
    try:
        info = read_info(folder, strict=True, within=prefix) or {}
    except CorruptRecordError as exc:
        info, damaged = {}, True
        problems.append(str(exc))
    try:
        status = read_status(folder, strict=True, within=prefix)
    except CorruptRecordError as exc:
        status = None
        problems.append(str(exc))
    fs, path = fsx.filesystem(fsx.join(folder, INFO_FILE))
    started = _mtime(fs, path) if info else None
    name = info.get("name")
    if not isinstance(name, str):
        base = relative.rsplit("-", 1)
        name = base[0] if len(base) == 2 and len(base[1]) == 8 else relative
    return StepRow(
        name=name,
        path=relative,
        status=status.status if status else None,
        status_time=status.time if status else None,
        started=started,
        identity=info.get("identity") if isinstance(info.get("identity"), str) else (status.identity if status else None),
        version=info.get("version"),
        error=status.error if status else None,
        record_damaged=damaged,
        problems=tuple(problems),
        configuration=_digest(info.get("hash_attrs")) if info else None,
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def list_rows(prefix: str) -> list[StepRow]:
    folders = step_folders(prefix)
    with ThreadPoolExecutor(max_workers=_READERS, thread_name_prefix="serve-list") as pool:
        return list(pool.map(lambda folder: read_row(prefix, folder), folders))


def newest_first(rows: list[StepRow]) -> list[StepRow]:
    """Rows by their last status time, newest first (a row with no status last), then by folder."""
    return sorted(rows, key=lambda row: (-(row.status_time or row.started or 0.0), row.path))


def version_marks(rows: list[StepRow]) -> dict[str, bool | None]:
    """Per path: ``True`` for the newest of several outputs of one name and one configuration (equal
    hash attributes: a rerun with another version, code or data), ``False`` for the older ones, and
    ``None`` where there is nothing to tell apart. Outputs of one name with other settings (another
    learning rate) are other experiments, neither newer nor older than each other: not marked."""
    by_name: dict[tuple[str, str | None], list[StepRow]] = {}
    for row in rows:
        by_name.setdefault((row.name, row.configuration), []).append(row)
    marks: dict[str, bool | None] = {}
    for group in by_name.values():
        newest = newest_first(group)[0].path if len(group) > 1 else None
        marks.update({row.path: None if newest is None else row.path == newest for row in group})
    return marks


def step_folder(prefix: str, path: str) -> str:
    """The folder of the step at ``path`` (relative to the prefix), or :class:`NotFoundError`."""
    folder = resolve(prefix, path)
    fs, root = fsx.filesystem(folder)
    if not (fs.exists(f"{root}/{INFO_FILE}") or fs.exists(f"{root}/.executor_status")):
        raise NotFoundError(f"no step output at {path!r} under {prefix} (no .executor_info or .executor_status there)")
    return folder


def read_json_file(url: str, within: str) -> Any | None:
    """A JSON file's content, ``None`` when absent, :class:`UnreadableError` when damaged or refused
    (no regular file, larger than a record may be, or a link out of ``within``)."""
    try:
        text = read_bounded_text(url, within=within)
    except RefusedFileError as exc:
        raise UnreadableError(str(exc)) from exc
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UnreadableError(f"{url} is not valid JSON ({exc})") from exc


@dataclass(frozen=True)
class StepDetail:
    row: StepRow
    info: dict[str, Any]
    artifact: Any | None
    dependencies: list[dict[str, Any]]  # name, identity, path (relative, or None when outside the prefix)
    dependents: list[StepRow]
    other_versions: list[StepRow]
    files: list[dict[str, Any]]


def step_detail(prefix: str, path: str, rows: list[StepRow] | None = None) -> StepDetail:
    folder = step_folder(prefix, path)
    try:
        info = read_info(folder, strict=True, within=prefix) or {}
    except CorruptRecordError as exc:
        raise UnreadableError(str(exc)) from exc
    row = read_row(prefix, folder)
    artifact = read_json_file(fsx.join(folder, ARTIFACT_FILE), prefix)
    dependencies = [
        {"name": dep.get("name"), "identity": dep.get("identity"), "path": relative_to(prefix, dep_path) if dep_path else None}
        for dep, dep_path in recorded_dependency_paths(folder, info)
    ]
    rows = list_rows(prefix) if rows is None else rows
    dependents = []
    for other in rows:
        if other.path == row.path or other.record_damaged:
            continue
        other_info = read_info(resolve(prefix, other.path), within=prefix) or {}
        deps = other_info.get("deps") or []
        if any(isinstance(d, dict) and d.get("identity") == row.identity and row.identity for d in deps):
            dependents.append(other)
    other_versions = [other for other in rows if other.name == row.name and other.path != row.path]
    return StepDetail(row, info, artifact, dependencies, dependents, other_versions, list_files(folder))


def list_files(folder: str) -> list[dict[str, Any]]:
    """The folder's direct entries: name, kind, size (not recursive: a checkpoint folder can be huge)."""
    entries = fsx.ls(folder, detail=True)
    files = []
    for entry in entries:
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        files.append({"name": name, "type": entry.get("type"), "size": entry.get("size")})
    files.sort(key=lambda f: (f["type"] != "directory", f["name"]))
    return files


def version_differences(prefix: str, path_a: str, path_b: str) -> list[str]:
    """``marin explain``-style differences between two outputs (identity records) under the prefix."""
    try:
        return identity_differences(step_folder(prefix, path_a), step_folder(prefix, path_b), within=prefix)
    except CorruptRecordError as exc:
        raise UnreadableError(str(exc)) from exc
