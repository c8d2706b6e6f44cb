"""File helpers for zephyr, on top of ``rigging.filesystem``.

Every output zephyr writes (a dataset shard, a token-cache array, a ledger) must be complete or
absent, so a crash or SIGKILL never leaves a half-written file that a rerun mistakes for a finished
one. On local disk :func:`atomic_open` is rigging's (temporary sibling + ``os.replace``). On object
stores rigging buffers the whole file in memory before one upload, which is right for small
records but not for a multi-gigabyte token shard; there we stream to a temporary object instead and
move it into place once complete (an object appears whole when its copy finishes).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO

import fsspec
import fsspec.implementations.local
from rigging import filesystem as rfs

_TEMP_MARKER = rfs.TEMPORARY_MARKER


def url_to_fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(filesystem, path inside it)`` for a local path or any fsspec URL."""
    return rfs.filesystem(url)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, fsspec.implementations.local.LocalFileSystem)


def join_url(base: str, *parts: str) -> str:
    return rfs.join(base, *parts)


def is_temporary_name(path: str) -> bool:
    """True for the names atomic writes use while a file is in progress.

    Looser than :func:`rigging.filesystem.is_temporary_name` on purpose: this decides what is never
    read as input (skipping too much is harmless), while rigging's decides what may be deleted.
    """
    return _TEMP_MARKER in os.path.basename(path)


@contextlib.contextmanager
def atomic_open(url: str, mode: str = "wb") -> Iterator[IO]:
    """Open ``url`` for writing; it appears only when the ``with`` block succeeds, else nothing changes."""
    with rfs.atomic_open(url, mode) as handle:
        yield handle


def atomic_write_text(url: str, text: str) -> None:
    rfs.atomic_write(url, text)


def exists(url: str) -> bool:
    return rfs.exists(url)


def remove_if_exists(url: str) -> None:
    rfs.rm(url)
