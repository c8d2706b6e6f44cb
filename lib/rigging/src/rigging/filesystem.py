"""One way to touch files, local or remote: thin helpers over fsspec.

Every function takes a path or any fsspec URL (``gs://``, ``s3://``, ``memory://``...). Writes that
others may read concurrently go through :func:`atomic_write` / :func:`atomic_open`, so a reader
sees either the old content or the new, never a half-written file. Writes under a condition the
store checks (create if absent, replace or delete if unchanged), on which leases build, are in
:mod:`rigging.conditional_writes`.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import random
import re
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations

from rigging.errors import RiggingError


class FilesystemUnavailableError(RiggingError):
    """A URL no installed fsspec filesystem can open: ``reason`` says why, ``remedy`` what to do."""

    def __init__(self, url: str, reason: str, remedy: str) -> None:
        self.url, self.reason, self.remedy = url, reason, remedy
        super().__init__(f"Cannot open {url!r}: {reason}; {remedy}.")


class UnknownProtocolError(FilesystemUnavailableError, ValueError):
    """The URL's protocol is not one fsspec (or any installed plugin) knows."""


class FilesystemPackageMissingError(FilesystemUnavailableError, ImportError):
    """The URL's protocol is known, but the package that implements it is not installed."""


def check_protocol(url: str) -> None:
    """Raise :class:`FilesystemUnavailableError` unless every protocol in ``url`` can be opened here.

    Plain paths always pass. Chained URLs (``simplecache::gs://...``) are checked link by link.
    """
    for link in str(url).split("::"):
        protocol, _ = fsspec.core.split_protocol(link)
        if protocol is None or protocol == "file":
            continue
        try:
            fsspec.get_filesystem_class(protocol)
        except ImportError as exc:
            implementation = known_implementations.get(protocol, {})
            package = implementation.get("class", "").split(".")[0]
            if package and package != "fsspec":
                raise FilesystemPackageMissingError(
                    str(url), f"{protocol}:// needs the {package} package, which is not installed", f"pip install {package}"
                ) from exc
            # Implemented inside fsspec but missing a dependency; fsspec's own note names it.
            raise FilesystemPackageMissingError(
                str(url), f"{protocol}:// cannot be opened here", str(implementation.get("err") or exc)
            ) from exc
        except ValueError:
            raise UnknownProtocolError(
                str(url),
                f"the protocol {protocol!r} is unknown (no installed fsspec filesystem provides it)",
                "use a local path or a URL such as gs://bucket/path, s3://bucket/path or memory://path",
            ) from None


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem for ``url`` and the path within it."""
    if isinstance(url, str) and url.startswith("/") and "://" not in url and "::" not in url:
        # A plain absolute path: what fsspec would answer, without parsing the URL (the engine
        # calls this several times per file it touches, tens of times per step).
        return _local_filesystem(), url.rstrip("/") or "/"
    try:
        fs, path = fsspec.core.url_to_fs(str(url))
    except (ValueError, ImportError):
        check_protocol(url)  # says which package to install, or that the protocol is unknown
        raise
    return fs, path


_LOCAL: LocalFileSystem | None = None


def _local_filesystem() -> LocalFileSystem:
    global _LOCAL
    if _LOCAL is None:
        _LOCAL = LocalFileSystem()
    return _LOCAL


def is_local(url: str) -> bool:
    return isinstance(filesystem(url)[0], LocalFileSystem)


def join(url: str, *parts: str) -> str:
    """Join path segments onto a path or URL with ``/`` (never the OS separator, which breaks URLs)."""
    result = str(url)
    for part in parts:
        part = str(part)
        if not part:
            continue
        if "://" in part or part.startswith("/"):
            result = part
            continue
        result = result.rstrip("/") + "/" + part.lstrip("/")
    return result


def absolute(url: str | os.PathLike) -> str:
    """A local path (or ``file://`` URL) as an absolute local path; any other URL exactly as given.

    Use this where ``os.path.abspath`` would be wrong: it turns ``s3://b/x`` into ``./s3:/b/x``.
    """
    url = os.fspath(url)
    protocol, path = fsspec.core.split_protocol(url)
    if protocol is None:
        return os.path.abspath(url)
    if protocol in ("file", "local"):
        return os.path.abspath(path)
    return url


def open_url(url: str, mode: str = "rb", **kwargs: Any) -> IO:
    """Open ``url`` like :func:`open`; parent folders are created for writes on local disk."""
    if any(flag in mode for flag in "wax") and is_local(url):
        makedirs(os.path.dirname(filesystem(url)[1]) or ".")
    return fsspec.open(str(url), mode, **kwargs).open()


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def ls(url: str, detail: bool = False) -> list:
    """Entries of a folder as full paths/URLs (or fsspec detail dicts with ``detail=True``)."""
    fs, path = filesystem(url)
    entries = fs.ls(path, detail=detail)
    protocol = _protocol_prefix(url)
    if detail:
        # Copies: the dicts may be the filesystem's own listing cache (s3fs, gcsfs), which must keep
        # its bare names, or its later exists()/info() calls stop finding these files.
        return [{**entry, "name": protocol + entry["name"] if protocol and "://" not in entry["name"] else entry["name"]}
                for entry in entries]
    return [protocol + e if protocol and "://" not in e else e for e in entries]


def makedirs(url: str) -> None:
    fs, path = filesystem(url)
    fs.makedirs(path, exist_ok=True)


def rm(url: str, recursive: bool = False) -> None:
    """Delete a file (or a folder with ``recursive=True``); missing paths are not an error."""
    fs, path = filesystem(url)
    if fs.exists(path):
        fs.rm(path, recursive=recursive)


def read_text(url: str) -> str | None:
    """The file's text, or ``None`` if it does not exist (one request instead of exists + read)."""
    fs, path = filesystem(url)
    try:
        return fs.cat_file(path).decode("utf-8")
    except FileNotFoundError:
        return None


def _protocol_prefix(url: str) -> str:
    url = str(url)
    if "://" in url and not url.startswith("file://"):
        return url.split("://", 1)[0] + "://"
    return ""


# Every atomic write in the project names its in-progress file with :func:`temporary_name_for`, so
# one rule (:func:`is_temporary_name`) recognises what a killed writer can leave behind.
TEMPORARY_MARKER = ".tmp-"
_TEMPORARY_NAME = re.compile(r"^\..+\.tmp-[0-9a-f]{12}$")


def temporary_name_for(path: str) -> str:
    """The in-progress name for a write of ``path``: a hidden sibling ``.NAME.tmp-<12 hex>``.

    A sibling, so the final rename stays within one folder (atomic on POSIX); hidden, so folder
    listings meant for readers pass over it; random, so concurrent writers never share one. Works on
    local paths and on the in-filesystem paths of fsspec URLs alike.
    """
    folder, separator, name = str(path).rpartition("/")
    # Python's generator, not the system's: no system call per write, and reseeded in a forked child.
    return f"{folder}{separator}.{name}{TEMPORARY_MARKER}{random.getrandbits(48):012x}"


def is_temporary_name(path: str) -> bool:
    """True for names made by :func:`temporary_name_for` (strict, so no ordinary file matches)."""
    return bool(_TEMPORARY_NAME.match(str(path).rstrip("/").rpartition("/")[2]))


def find_files(url: str) -> list[str]:
    """Every file under the folder ``url``, recursively, as paths relative to it (``sub/name``).

    One recursive listing (a paginated list request on an object store), no per-file stat; ``[]``
    when the folder does not exist.
    """
    fs, path = filesystem(url)
    root = path.rstrip("/")
    if isinstance(fs, LocalFileSystem):
        return sorted(_local_files(root))
    try:
        found = fs.find(root)
    except FileNotFoundError:
        return []
    return sorted(f[len(root) + 1 :] for f in found if f.startswith(root + "/"))


def _local_files(root: str, prefix: str = "") -> Iterator[str]:
    """What fsspec's ``find`` lists under a local folder (anything not a folder a file, a link to a
    folder too: links are not followed), from the folder listings alone: no status call per file."""
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from _local_files(entry.path, f"{prefix}{entry.name}/")
        else:
            yield prefix + entry.name


def upload_files(local_folder: str, names: list[str], url: str) -> None:
    """Copy the files ``names`` (relative to the local folder) to the same names under ``url``.

    One batched transfer (concurrent uploads on object stores). For what a tool can only write to
    local disk (a profiler trace, TensorBoard events, a staged checkpoint) and must end up in an
    output that may be a URL.
    """
    if not names:
        return
    fs, remote = filesystem(url)
    local = local_folder.rstrip("/")
    fs.put([f"{local}/{name}" for name in names], [f"{remote.rstrip('/')}/{name}" for name in names])


def remove_files(url: str, names: list[str]) -> None:
    """Delete ``names`` (relative to the folder ``url``) in one call, a batch delete on object stores."""
    if not names:
        return
    fs, path = filesystem(url)
    root = path.rstrip("/")
    with contextlib.suppress(FileNotFoundError):
        fs.rm([f"{root}/{name}" for name in names])


def remove_empty_folder(url: str) -> bool:
    """Remove the folder ``url`` if it is empty (or already gone): True then. False when it holds
    anything, and always on an object store, which has no folders to remove (callers then look
    inside, at their own cost)."""
    fs, path = filesystem(url)
    if not isinstance(fs, LocalFileSystem):
        return False
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


# What a thread wraps each wait for the disk in (:func:`flushing_with`); none: the plain call.
_around_fsync: contextvars.ContextVar[Callable[[], contextlib.AbstractContextManager] | None] = contextvars.ContextVar(
    "rigging_around_fsync", default=None
)


@contextlib.contextmanager
def flushing_with(around: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """Wrap each ``fsync`` this thread's durable writes make, inside the block, in ``around()``.

    An ``fsync`` waits for the disk, often milliseconds, without Python's global lock. A caller that
    limits how many of its threads work at once can let others work meanwhile, and several threads
    waiting at once share one journal commit of the filesystem instead of queueing for one each.
    """
    token = _around_fsync.set(around)
    try:
        yield
    finally:
        _around_fsync.reset(token)


def fsync(descriptor: int) -> None:
    """``os.fsync``, inside what :func:`flushing_with` set for this thread."""
    around = _around_fsync.get()
    if around is None:
        os.fsync(descriptor)
        return
    with around():
        os.fsync(descriptor)


def atomic_write(url: str, data: str | bytes, *, durable: bool = True) -> None:
    """Replace ``url`` with ``data`` so that readers never observe a partial file.

    Local disk: a temporary sibling renamed over the target. Elsewhere: one upload of the whole
    content, which an object store publishes only once it is complete. ``durable`` as for
    :func:`atomic_open`.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fs, path = filesystem(url)
    if isinstance(fs, LocalFileSystem):
        write_local_atomically(path, payload, durable=durable)
        return
    fs.pipe_file(path, payload)


# The engine writes and reads a dozen small records per step. Python's ``open`` adds to each file
# three or four system calls of its own (status, terminal check, position) around the one read or
# write; a graph of thousands of small steps spends a good part of its time in them. So records
# whose content is at hand go through the descriptor directly.
_READ_CHUNK = 1 << 16


def create_local_file(path: str) -> int:
    """A descriptor of the new local file ``path``, open for writing (``FileExistsError`` if there
    is one); its folders are made first if they are missing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:  # most writes go to a folder that exists: made only when the open says so
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return os.open(path, flags, 0o666)


def write_local_atomically(path: str, payload: bytes, *, durable: bool = True) -> None:
    """:func:`atomic_write` of ``payload`` to the local ``path`` (parents made if missing)."""
    temp_path = temporary_name_for(path)
    descriptor = create_local_file(temp_path)
    try:
        try:
            write_all(descriptor, payload)
            if durable:
                fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp_path)
        raise


def write_all(descriptor: int, payload: bytes) -> None:
    """Write all of ``payload`` to ``descriptor`` (``os.write`` may write less than it is given)."""
    view = memoryview(payload)
    while view:
        view = view[os.write(descriptor, view):]


def read_local_bytes(path: str) -> bytes:
    """The content of the local file ``path``; raises ``FileNotFoundError`` if there is none."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_all(descriptor)
    finally:
        os.close(descriptor)


def read_all(descriptor: int) -> bytes:
    """Everything from ``descriptor``'s position to the end of its (regular) file."""
    chunks = []
    while True:
        chunk = os.read(descriptor, _READ_CHUNK)
        chunks.append(chunk)
        if len(chunk) < _READ_CHUNK:  # a regular file reads short only at its end
            return b"".join(chunks)


@contextlib.contextmanager
def atomic_open(url: str, mode: str = "wb", *, durable: bool = True) -> Iterator[IO]:
    """Open ``url`` for writing; the file appears (or is replaced) only when the block succeeds.

    Writes stream, so memory stays bounded whatever the size. If the block raises, nothing changes.

    * Local disk: a temporary sibling, ``os.replace``d over the target (atomic on POSIX). With
      ``durable`` (the default) the content is on disk (``fsync``) before the rename, so even a
      machine crash leaves the old file or the new one, whole. ``durable=False`` skips that wait:
      still atomic for readers and against a killed writer, but a machine crash soon after may
      leave the old file, none, or an empty one; only for records whose loss a reader tolerates.
    * S3: straight to the target. S3 publishes an object only when its upload completes (one PUT,
      or the completion of a multipart upload), so a writer killed mid-way leaves nothing visible;
      if the block raises, a multipart upload in progress is aborted.
    * Other stores: a temporary sibling object, moved into place once complete (on an object store
      a copy, which publishes the target whole). A killed writer may leave the temporary behind,
      named so that :func:`is_temporary_name` recognises it.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', got {mode!r}.")
    fs, path = filesystem(url)
    if isinstance(fs, LocalFileSystem):
        temp_path = temporary_name_for(path)
        try:
            with _create_with_parents(temp_path, mode) as handle:
                yield handle
                handle.flush()
                if durable:
                    fsync(handle.fileno())
            os.replace(temp_path, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp_path)
            raise
        return
    if is_s3_filesystem(fs):
        upload = fs.open(path, "wb")
        text = io.TextIOWrapper(upload, encoding="utf-8") if mode == "w" else None
        try:
            yield text if text is not None else upload
            if text is not None:
                text.detach()  # flushes into the upload, leaving it open
            upload.close()  # completes the upload: the object appears, whole
        except BaseException:
            with contextlib.suppress(Exception):
                upload.discard()  # aborts a multipart upload already started
            upload.closed = True  # so that nothing (not even garbage collection) completes it
            raise
        return
    temp_path = temporary_name_for(path)
    try:
        with fs.open(temp_path, mode) as handle:
            yield handle
        fs.mv(temp_path, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(temp_path)
        raise


def _create_with_parents(path: str, mode: str) -> IO:
    """A new local file ``path`` open for writing in ``mode`` (``w`` or ``wb``), its folders made if
    missing: :func:`create_local_file`'s descriptor as a file object."""
    encoding = "utf-8" if mode == "w" else None
    return os.fdopen(create_local_file(path), mode, encoding=encoding)


def is_s3_filesystem(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is an S3 filesystem (without importing s3fs where nothing uses it)."""
    s3fs = sys.modules.get("s3fs")  # an S3 filesystem can exist only once s3fs is imported
    return s3fs is not None and isinstance(fs, s3fs.S3FileSystem)
