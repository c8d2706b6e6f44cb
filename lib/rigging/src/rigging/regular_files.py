"""Reading files that may hold anything: regular files only, never blocking, never unbounded.

What reads a prefix for a person (the web view, ``marin status``, ``marin logs``) meets whatever
the folder holds. On local disk a name can be a FIFO (opening it waits for a writer that never
comes), a device (``/dev/zero`` never ends), a socket, or a link to any of them. So a file is
opened here only when, links followed, it is a regular file: checked with ``stat`` before opening,
opened with ``O_NONBLOCK`` (so even a FIFO swapped in meanwhile cannot block) and checked again
with ``fstat`` on what was opened. With ``within``, its real path must also lie inside that folder
(a link out of it is refused). Whole-file reads are bounded: a file longer than the limit is
refused, not read. Object stores hold no special files or links; only the bound applies there.

A refusal raises :class:`RefusedFileError`, whose message names the file and why, so a reader can
show it in place of the content and go on with the rest. A writer that hands a folder on (a step's
commit) applies the same rule to all of it first, with :func:`refused_entries`.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from typing import IO

from fsspec.implementations.local import LocalFileSystem

from rigging import filesystem as fsx
from rigging.errors import RiggingError

RECORD_LIMIT_BYTES = 4 << 20  # a JSON record a runner writes (status, info, attempt) is a few KiB


class RefusedFileError(RiggingError, OSError):
    """A file that is there but is not read: not a regular file, too large, or outside ``within``."""

    def __init__(self, url: str, reason: str) -> None:
        self.url, self.reason = url, reason
        super().__init__(f"{url} is refused: {reason}")


class FileTooLargeError(RefusedFileError):
    """A regular file longer than the limit a whole-file read was given."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "of an unknown kind"


def _not_regular(url: str, mode: int) -> RefusedFileError:
    return RefusedFileError(url, f"not a regular file ({_kind(mode)})")


def _local_path(url: str) -> str | None:
    """The path of ``url`` on this machine's disk, ``None`` for an object store (resolved once: it is not free)."""
    fs, path = fsx.filesystem(url)
    return path if isinstance(fs, LocalFileSystem) else None


@functools.lru_cache(maxsize=64)
def _real_root(within: str) -> str | None:
    """Where the folder ``within`` really is, ``None`` off local disk. Kept: a reader checks every
    file of a listing against the same root, and a root moved since only makes more refusals."""
    path = _local_path(within)
    return None if path is None else _real(path)


def _real(path: str) -> str:
    return os.path.realpath(path)


def stays_within(within: str, url: str) -> bool:
    """Whether ``url`` lies inside the folder ``within`` once links are followed (always, off local disk)."""
    root = _real_root(within)
    if root is None:
        return True
    target = _real(fsx.filesystem(url)[1])
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def check_within(within: str | None, url: str) -> None:
    """:class:`RefusedFileError` when ``url`` (a file or a folder) leads out of ``within`` through a link."""
    if within is not None and not stays_within(within, url):
        raise RefusedFileError(url, f"a link to a place outside {within}")


def _check_local(url: str, path: str, within: str | None) -> None:
    check_within(within, url)
    if not stat.S_ISREG(mode := os.stat(path).st_mode):
        raise _not_regular(url, mode)


def refused_entries(folder: str) -> list[RefusedFileError]:
    """Every entry under the folder ``folder`` that the rule above refuses, in path order, without
    opening anything: a special file (FIFO, device, socket), and a link that leads out of ``folder``,
    to nothing (dangling, a loop) or to anything but a regular file. For a writer about to hand a
    folder on (a step's commit): what a reader would refuse is better refused before it is committed.
    ``[]`` off local disk (object stores hold no special files or links) and for a missing folder."""
    root = _local_path(folder)
    if root is None:
        return []
    real_roots: list[str] = []  # resolved at the first link: most outputs hold none
    refused: list[RefusedFileError] = []

    def walk(path: str, url: str) -> None:
        try:
            entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            entry_url = f"{url.rstrip('/')}/{entry.name}"
            if entry.is_symlink():
                real_roots[:] = real_roots or [_real(root)]
                reason = _link_problem(entry.path, real_roots[0], folder)
                if reason is not None:
                    refused.append(RefusedFileError(entry_url, reason))
                continue
            if entry.is_file(follow_symlinks=False):
                continue  # the listing says so: no status call per file
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                walk(entry.path, entry_url)
            elif not stat.S_ISREG(mode):
                refused.append(_not_regular(entry_url, mode))

    walk(root, folder)
    return refused


def _link_problem(path: str, real_root: str, folder: str) -> str | None:
    """Why the link at ``path`` is refused (``None``: it leads to a regular file inside ``real_root``)."""
    target = os.readlink(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"a link to nothing ({target} does not exist)"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a link loop ({target})"
        return f"a link that cannot be followed ({target}: {exc.strerror})"
    real = _real(path)
    if not (real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)):
        return f"a link to a place outside {folder} ({target})"
    if not stat.S_ISREG(mode):
        return f"a link to {_kind(mode)} ({target})"
    return None


def check_regular(url: str, *, within: str | None = None) -> None:
    """Refuse (:class:`RefusedFileError`) what :func:`open_regular` would refuse, without opening it:
    for files another library opens. ``FileNotFoundError`` when nothing is there."""
    path = _local_path(url)
    if path is not None:
        _check_local(url, path, within)


def open_regular(url: str, *, within: str | None = None) -> IO[bytes]:
    """``url`` opened for reading bytes, if it is a regular file (inside ``within``, when given).

    ``FileNotFoundError`` when nothing is there; :class:`RefusedFileError` for anything else that
    is not a regular file, without waiting on it.
    """
    path = _local_path(url)
    if path is None:
        fs, remote = fsx.filesystem(url)
        return fs.open(remote, "rb")
    return _open_local(url, path, within)


def _open_local(url: str, path: str, within: str | None) -> IO[bytes]:
    _check_local(url, path, within)  # before opening: opening some devices does something
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(mode := os.fstat(descriptor).st_mode):
            raise _not_regular(url, mode)  # replaced between the stat and the open
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def _read_local(url: str, path: str, within: str | None, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of the regular local file ``path``, in as few system calls as it
    takes (a run reads one record per step: thousands): a stat, an open, an fstat, the reads, a close."""
    _check_local(url, path, within)  # before opening: opening some devices does something
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(url, info.st_mode)  # replaced between the stat and the open
        if info.st_size > limit:
            raise FileTooLargeError(url, f"larger than {limit} bytes ({info.st_size} bytes)")
        # As much as fstat says and one byte more (reading ``limit + 1`` would allocate that much each
        # time); only a file that grew since fills that, and is read on up to the bound. A regular
        # file reads short only at its end, and O_NONBLOCK changes nothing for one.
        chunks: list[bytes] = []
        total, wanted = 0, info.st_size + 1
        while total <= limit:
            chunk = os.read(descriptor, wanted)
            chunks.append(chunk)
            total += len(chunk)
            if len(chunk) < wanted:
                break
            wanted = limit + 1 - total
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def read_bounded(url: str, limit: int = RECORD_LIMIT_BYTES, *, within: str | None = None) -> bytes | None:
    """The whole of a regular file of at most ``limit`` bytes; ``None`` when nothing is there.

    :class:`RefusedFileError` when it is not a regular file, lies outside ``within``, or is longer
    than ``limit`` (at most ``limit + 1`` bytes are read to tell).
    """
    path = _local_path(url)
    if path is None:
        fs, remote = fsx.filesystem(url)
        try:
            data = fs.cat_file(remote, start=0, end=limit + 1)  # one ranged request, as a plain read is one
        except FileNotFoundError:
            return None
    else:
        try:
            data = _read_local(url, path, within, limit)
        except (FileNotFoundError, NotADirectoryError):
            return None
    if len(data) > limit:
        raise FileTooLargeError(url, f"larger than {limit} bytes")
    return data


def read_bounded_text(url: str, limit: int = RECORD_LIMIT_BYTES, *, within: str | None = None) -> str | None:
    """:func:`read_bounded` decoded as UTF-8 (undecodable bytes replaced, as a damaged record reads)."""
    data = read_bounded(url, limit, within=within)
    return None if data is None else data.decode("utf-8", errors="replace")
