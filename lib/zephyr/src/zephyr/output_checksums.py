"""The checksums a finished step recorded for its output files, and the check that they still hold.

A token cache and a checkpoint carry checksums of their own; a step's other outputs (jsonl, zst,
parquet and text shards) are only bytes, and a byte changed after the step finished would flow into
every step that reads them. So when a step's output is committed, the engine writes
``.output_checksums.json`` into its folder::

    {"algorithm": "sha256", "files": {"data/part-00000-of-00004.jsonl.zst": {"size": 1048576, "sha256": "9f2c..."}}}

mapping each file (relative to the folder) to its size and SHA-256, the digest ``sha256sum`` prints,
so a person can check a file by hand. Hidden names (a path with a part starting with ``.``) are not
recorded: the engine's own records and folders, and the temporaries of atomic writes, are all hidden,
and some of them change after the commit.

**Where it is checked.** A reader checks a file when it opens it, before handing on its first record
(:func:`check_recorded_checksum`): the file is found in the manifest of the nearest folder above it
that has one, hashed whole, and compared. Hashing first, rather than as the records stream, costs one
more read of the file (from the page cache on local disk; a second download from an object store),
and buys three things: a changed file never reaches the reading step at all; the mismatch is what
is reported even where the change also breaks the file's compression or JSON (which a step could be
told to skip as damaged input); and it serves readers that seek (Parquet) or stop early (a sample)
alike. Only the files a step opens are hashed: an evaluation that reads one checkpoint of a training
step does not hash the others. ``bench/output_checksums.py`` measures the cost.

Folders without a manifest (outputs of steps committed before manifests were written, and every
input that is no step's output) read as before, unchecked and silently. On an object store, where
each look for a manifest is a request, a folder found without one is remembered as such (see
:data:`ABSENT_KEPT_S`), so opening the shards of a folder asks once per folder above them, not
once per shard. A file the manifest does not
list is not checked either; nor are folders whose files carry checksums of their own (checkpoints,
token-cache shards), which the engine names when it commits (``self_checked``).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Collection
from dataclasses import dataclass
from typing import IO

from rigging import filesystem as fsx
from rigging.regular_files import open_regular

from zephyr.errors import ZephyrError

MANIFEST_NAME = ".output_checksums.json"
ALGORITHM = "sha256"
_CHUNK_BYTES = 4 << 20
# Files on object stores are hashed several at a time: parallel streams get more throughput.
_THREADS = 8


class OutputChangedError(ZephyrError, ValueError):
    """A step's output file is not what the step recorded when it committed it."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}; the output was changed after the step finished")

    def __reduce__(self):  # keeps the fields when sent back from a worker process
        return (type(self), (self.path, self.problem))


@dataclass(frozen=True)
class RecordedFile:
    size: int
    sha256: str


def is_recorded_name(relative: str) -> bool:
    """Whether a file at ``relative`` (to the step folder) is recorded: no part of it is hidden."""
    return not any(part.startswith(".") for part in relative.split("/"))


def _hash_handle(handle: IO[bytes]) -> tuple[int, str]:
    hasher = hashlib.sha256()
    size = 0
    while chunk := handle.read(_CHUNK_BYTES):
        hasher.update(chunk)
        size += len(chunk)
    return size, hasher.hexdigest()


def file_checksum(url: str) -> RecordedFile:
    """The size and SHA-256 of the file at ``url``; a special file is refused, never opened
    (:class:`~rigging.regular_files.RefusedFileError`: a FIFO would block the open, a device never end)."""
    with open_regular(url) as handle:
        return RecordedFile(*_hash_handle(handle))


def _checksums(folder: str, names: list[str]) -> list[RecordedFile]:
    urls = [fsx.join(folder, name) for name in names]
    if fsx.is_local(folder) or len(urls) < 2:  # a local disk gains nothing from threads
        return [file_checksum(url) for url in urls]
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(urls))) as pool:
        return list(pool.map(file_checksum, urls))


def _under_self_checked(names: list[str], markers: Collection[str]) -> set[str]:
    """The names that lie in a folder holding one of ``markers`` (at any depth below it)."""
    marked = {posixpath.dirname(name) for name in names if posixpath.basename(name) in markers}
    if not marked:
        return set()

    def covered(name: str) -> bool:
        folder = posixpath.dirname(name)
        while True:
            if folder in marked:
                return True
            if not folder:
                return False
            folder = posixpath.dirname(folder)

    return {name for name in names if covered(name)}


def write_checksums(folder: str, *, self_checked: Collection[str] = ()) -> dict[str, RecordedFile]:
    """Hash every recorded file under ``folder`` into ``<folder>/.output_checksums.json`` (atomically).

    A folder with no file to record gets no manifest: it would check nothing, as a folder without
    one checks nothing (a reader of a file below finds no entry for it either way).

    ``self_checked``: names of the files that mark a folder whose files carry checksums of their own,
    which their own reader verifies (a checkpoint's manifest, a token-cache shard's summary). Such a
    folder is left out: hashing it again would read gigabytes at every commit (a second download on an
    object store) for no check that is not already made.
    """
    names = [name for name in fsx.find_files(folder) if is_recorded_name(name)]
    covered = _under_self_checked(names, self_checked)
    names = [name for name in names if name not in covered]
    if not names:
        return {}
    files = dict(zip(names, _checksums(folder, names)))
    record = {"algorithm": ALGORITHM,
              "files": {name: {"size": entry.size, "sha256": entry.sha256} for name, entry in files.items()}}
    fsx.atomic_write(fsx.join(folder, MANIFEST_NAME), json.dumps(record, sort_keys=True))  # the C encoder: one line
    _forget_absences()  # the folder this manifest lands in may have been seen without one
    return files


def _parse(url: str, raw: bytes) -> dict[str, RecordedFile]:
    try:
        record = json.loads(raw)
        if record["algorithm"] != ALGORITHM:
            raise ValueError(f"unknown algorithm {record['algorithm']!r}")
        return {name: RecordedFile(int(entry["size"]), str(entry["sha256"])) for name, entry in record["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise OutputChangedError(url, f"the step's record of its output files cannot be read ({type(error).__name__}: "
                                      f"{error})") from None


def read_checksums(folder: str) -> dict[str, RecordedFile] | None:
    """The files ``folder``'s manifest records; None when it has none (a step committed before manifests)."""
    url = fsx.join(folder, MANIFEST_NAME)
    fs, path = fsx.filesystem(url)
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    return _parse(url, raw)


# Parsed manifests, by the manifest's path and what its storage says of its version: every shard of a
# step looks its own file up in the same manifest, which is read once per process while unchanged.
_parsed: dict[tuple[str, str], dict[str, RecordedFile]] = {}
_parsed_lock = threading.Lock()
_PARSED_KEPT = 64


# Folders of an object store found without a manifest, by URL, with when. A manifest is written only
# into a step's folder, by the commit that brings in the files it records, so a folder seen without
# one normally stays so for the files read from it. Two things can add one later: a commit in this
# process (write_checksums forgets every absence at once) and a commit by another process (seen once
# the absence is ABSENT_KEPT_S old). Local disks are asked each time: a stat costs microseconds.
ABSENT_KEPT_S = 60.0
_absent: dict[str, float] = {}
_absent_lock = threading.Lock()
_ABSENT_KEPT = 4096
_clock = time.monotonic


def _known_absent(folder_url: str) -> bool:
    with _absent_lock:
        seen = _absent.get(folder_url)
    return seen is not None and _clock() - seen < ABSENT_KEPT_S


def _remember_absent(folder_url: str) -> None:
    with _absent_lock:
        if len(_absent) >= _ABSENT_KEPT:
            _absent.clear()
        _absent[folder_url] = _clock()


def _forget_absences() -> None:
    with _absent_lock:
        _absent.clear()


def _version(info: dict) -> str:
    stamp = next((info[key] for key in ("mtime", "ETag", "etag", "md5Hash", "generation", "LastModified", "updated")
                  if info.get(key) is not None), None)
    return f"{info.get('size')}:{stamp}"


def recorded_checksum(url: str) -> tuple[str, RecordedFile] | None:
    """``(manifest url, what it records for the file at url)``, from the nearest folder above ``url``
    with a manifest; None when no folder up to the first hidden one has one, or it does not list the file.
    """
    fs, path = fsx.filesystem(url)
    protocol = url.split("://", 1)[0] + "://" if "://" in url and not url.startswith("file://") else ""
    relative = posixpath.basename(path.rstrip("/"))
    folder = posixpath.dirname(path.rstrip("/"))
    while relative and is_recorded_name(relative):
        manifest = f"{folder.rstrip('/')}/{MANIFEST_NAME}"
        info = None
        if not (protocol and _known_absent(protocol + folder)):
            try:
                info = fs.info(manifest)
            except FileNotFoundError:
                if protocol:
                    _remember_absent(protocol + folder)
            except PermissionError:  # a store that lets this reader see only a part of it: nothing above is ours
                return None
        if info is not None:
            key = (protocol + manifest, _version(info))
            with _parsed_lock:
                files = _parsed.get(key)
            if files is None:
                files = _parse(protocol + manifest, fs.cat_file(manifest))
                with _parsed_lock:
                    if len(_parsed) >= _PARSED_KEPT:
                        _parsed.clear()
                    _parsed[key] = files
            entry = files.get(relative)
            return None if entry is None else (protocol + manifest, entry)
        parent = posixpath.dirname(folder.rstrip("/"))
        if not parent or parent == folder:
            return None
        relative = f"{posixpath.basename(folder.rstrip('/'))}/{relative}"
        folder = parent
    return None


def _mismatch(recorded: RecordedFile, found: RecordedFile) -> str | None:
    if found.size != recorded.size:
        return f"it holds {found.size:,} bytes but the step recorded {recorded.size:,} when it committed"
    if found.sha256 != recorded.sha256:
        return f"its sha256 is {found.sha256} but the step recorded {recorded.sha256} when it committed"
    return None


def check_recorded_checksum(url: str, handle: IO[bytes] | None = None) -> None:
    """Raise :class:`OutputChangedError` when ``url`` is a step's recorded output file that changed since.

    ``handle``: the file already open for reading at its start (it is hashed, then rewound); without
    one the file is opened here. Files no manifest records pass unchecked.
    """
    found = recorded_checksum(url)
    if found is None:
        return
    _, recorded = found
    if handle is None:
        actual = file_checksum(url)
    else:
        actual = RecordedFile(*_hash_handle(handle))
        handle.seek(0)
    problem = _mismatch(recorded, actual)
    if problem:
        raise OutputChangedError(url, problem)


def changed_files(folder: str) -> list[OutputChangedError] | None:
    """Every recorded file of ``folder`` that changed, went missing or is unreadable as recorded, in
    order; ``[]`` when all hold, None when the folder has no manifest."""
    recorded = read_checksums(folder)
    if recorded is None:
        return None
    names = sorted(recorded)
    present = set(fsx.find_files(folder))
    problems = [OutputChangedError(fsx.join(folder, name), "it is missing, but the step recorded it when it committed")
                for name in names if name not in present]
    there = [name for name in names if name in present]
    for name, actual in zip(there, _checksums(folder, there)):
        problem = _mismatch(recorded[name], actual)
        if problem:
            problems.append(OutputChangedError(fsx.join(folder, name), problem))
    return sorted(problems, key=lambda error: error.path)


__all__ = [
    "ABSENT_KEPT_S",
    "ALGORITHM",
    "MANIFEST_NAME",
    "OutputChangedError",
    "RecordedFile",
    "changed_files",
    "check_recorded_checksum",
    "file_checksum",
    "is_recorded_name",
    "read_checksums",
    "recorded_checksum",
    "write_checksums",
]
