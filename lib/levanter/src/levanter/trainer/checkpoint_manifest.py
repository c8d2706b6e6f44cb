"""Checksums of a checkpoint's files: a manifest written once the checkpoint is committed, verified before it is restored.

Orbax restores whatever bytes it finds: one flipped bit in an array's data file reads back as
different numbers (or NaN) without an error. So every committed step folder gets
``<step>/checksums.json``, listing each of its files (relative path) with its size and xxh3-128
digest, written after Orbax has committed the step and before anything else sees it as finished
(the upload of a staged checkpoint; see :mod:`levanter.trainer.checkpoint_staging`). Restoring
first compares the files with it, and the manifest must cover the folder exactly: a file missing,
of another size or with another digest, and a file on disk that it does not list (a hole in the
manifest would let that file change unseen) make the checkpoint unreadable, and
:class:`~levanter.trainer.checkpoint.Checkpointer` moves it aside and falls back to the one before,
as it does for files Orbax cannot parse.

Why a manifest of our own rather than Orbax's: Orbax has no checksum of its own for the files it
writes (TensorStore's zarr3 driver has a ``crc32c`` codec, but Orbax builds the array specs itself
and exposes no option for it; its metadata files, ``_METADATA`` and ``_sharding``, would stay
unprotected either way). A manifest covers every file whatever wrote it, works the same on a local
disk, ``gs://`` and staged object stores (it is written and read through fsspec), and is a plain
JSON record a person can read. xxh3-128: hashes at memory speed (the check is bound by reading the
files), and 128 bits leave no realistic chance that damage keeps the digest.

What it costs: reading the checkpoint once more after each save (from the page cache locally,
usually; a download on ``gs://``; staged checkpoints are hashed in their local folder before
upload) in the background thread of an asynchronous save, and reading it once more before a
restore. ``bench/checkpoint_checksum.py`` measures both; on a busy 2-core machine, the 1.7 GB
train state of ``llama_150m``: manifest written in 1.8 s and verified in 1.2 s, against saves of
22-28 s and restores of 16-25 s; the nano model's 7 MB: 0.015 s and 0.028 s.

What it does not cover: a run stopped between Orbax's commit and the manifest leaves a committed
step without one, like a checkpoint written before manifests existed. Nothing vouches for such a
step's files, so a resume treats it as damaged unless the run allows unverified checkpoints
(``TrainerConfig.allow_unverified_checkpoints``), and then restores it saying so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import xxhash

from rigging import filesystem as fsx

MANIFEST_NAME = "checksums.json"
ALGORITHM = "xxh3_128"
_CHUNK_BYTES = 8 << 20
# Remote files are hashed several at a time: object stores give more throughput to parallel streams.
_THREADS = 8


@dataclass(frozen=True)
class Verification:
    """The outcome of comparing a step folder with its manifest.

    ``problems`` (one line per file, naming it) is empty when the folder holds exactly the listed
    files and each matches; ``has_manifest`` is False for a step written without one (nothing could
    be checked).
    """

    has_manifest: bool
    problems: tuple[str, ...] = ()
    files: int = 0
    num_bytes: int = 0
    seconds: float = 0.0


def _digest(url: str) -> tuple[int, str]:
    """(size, ``"xxh3_128:<hex>"``) of the file at ``url``, streamed through one reused buffer."""
    fs, path = fsx.filesystem(url)
    hasher = xxhash.xxh3_128()
    size = 0
    with fs.open(path, "rb") as handle:
        # Chunks as large as the file needs: most of a checkpoint's files are small metadata.
        while chunk := handle.read(_CHUNK_BYTES):
            hasher.update(chunk)
            size += len(chunk)
    return size, f"{ALGORITHM}:{hasher.hexdigest()}"


def _digests(step_url: str, names: Iterable[str]) -> dict[str, tuple[int, str] | BaseException]:
    names = list(names)

    def one(name: str) -> tuple[int, str] | BaseException:
        try:
            return _digest(fsx.join(step_url, name))
        except FileNotFoundError as e:
            return e

    if fsx.is_local(step_url) or len(names) < 2:  # a local disk gains nothing from threads that cost a start each
        return {name: one(name) for name in names}
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(names))) as pool:
        return dict(zip(names, pool.map(one, names)))


def write_manifest(step_url: str, exclude: Iterable[str] = ()) -> None:
    """Hash every file of the committed step folder ``step_url`` (but ``exclude``) into its manifest,
    written atomically, last."""
    skipped = {MANIFEST_NAME, *exclude}
    names = [name for name in fsx.find_files(step_url) if name not in skipped]
    files = {}
    for name, found in _digests(step_url, names).items():
        if isinstance(found, BaseException):
            raise found
        files[name] = {"size": found[0], "digest": found[1]}
    record = {"algorithm": ALGORITHM, "files": files}
    fsx.atomic_write(fsx.join(step_url, MANIFEST_NAME), json.dumps(record, indent=1, sort_keys=True))


def verify_manifest(step_url: str, exclude: Iterable[str] = ()) -> Verification:
    """Compare the files of ``step_url`` with its manifest (see :class:`Verification`).

    Every file of the folder (recursively; but the manifest and ``exclude``, which
    :func:`write_manifest` was given) must be listed, and every listed name must be a file of the
    folder. Storage that cannot be reached raises (that says nothing about the files); a damaged
    manifest is a problem like a damaged file.
    """
    fs, path = fsx.filesystem(fsx.join(step_url, MANIFEST_NAME))
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return Verification(has_manifest=False)
    started = time.perf_counter()
    try:
        record = json.loads(raw)
        files = record["files"]
        expected = {name: (int(entry["size"]), str(entry["digest"])) for name, entry in files.items()}
        if record["algorithm"] != ALGORITHM:
            raise ValueError(f"unknown algorithm {record['algorithm']!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return Verification(has_manifest=True, problems=(f"{MANIFEST_NAME} is damaged ({type(e).__name__}: {e})",))
    on_disk = set(fsx.find_files(step_url)) - {MANIFEST_NAME}
    problems = {name: f"{name} is not listed in {MANIFEST_NAME}" for name in on_disk - expected.keys() - set(exclude)}
    # Only names found in the folder are read: a listed name never reaches outside it.
    problems.update({name: f"{name} is missing" for name in expected.keys() - on_disk})
    total = 0
    for name, found in _digests(step_url, sorted(expected.keys() & on_disk)).items():
        size, digest = expected[name]
        if isinstance(found, BaseException):
            problems[name] = f"{name} is missing"
            continue
        total += found[0]
        if found[0] != size:
            problems[name] = f"{name} holds {found[0]} bytes, {size} when written"
        elif found[1] != digest:
            problems[name] = f"{name} does not match its checksum (written {digest}, found {found[1]})"
    return Verification(has_manifest=True, problems=tuple(problems[name] for name in sorted(problems)),
                        files=len(expected), num_bytes=total, seconds=time.perf_counter() - started)
