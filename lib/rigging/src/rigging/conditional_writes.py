"""Conditional writes: create a file only if absent, replace or delete it only if unchanged.

A lease (rigging.lease) is safe only if its lock file changes under conditions that the store
itself checks: create it only if absent; replace or delete it only if it still is the version the
caller read. Which backends offer that, and how, is decided here and nowhere else:

  local disk  create: hard link of a complete temporary file (the kernel refuses an existing
              target, between processes and over NFS). replace and delete: under an exclusive
              flock of the file's current inode (every replacer and deleter of the path takes it,
              so compare-then-write is one step between the processes of a machine; on NFS the
              kernel turns it into a lock the server arbitrates), compare, then ``os.replace``, or
              rename aside and remove. Where flock is refused (some FUSE mounts) the compare and
              the write are two steps: a change made between them is overwritten.
  s3://       PutObject with If-None-Match: *, PutObject and DeleteObject with If-Match: <ETag>.
              AWS S3 honours all three (conditional deletes since September 2025), and so does
              moto. An S3-compatible store that ignores these headers is not safe, and this cannot
              tell. Refused where the installed botocore cannot send them (_S3_CONDITIONS).
  memory://   every operation under one lock, so exact between threads. The store lives inside one
              process: no other process sees the lock at all.
  gs://       JSON-API requests with ifGenerationMatch: 0 to create (a multipart upload), the
              generation read to replace (the same upload) or delete. GCS honours all three; the
              test server (fake-gcs-server) honours the two uploads but not the delete. Refused where
              gcsfs no longer offers the request methods they are sent through (_GCS_REQUESTS).
  any other   refused (ConditionalWritesUnsupportedError): a check-then-write would let two
              writers both believe they won.

Local disk can also hold a file across other work (held): no conditional write or delete of it
lands until the holder is done, so the holder may read it, write other files that must appear only
while it still says what was read, then replace it. No other backend can (CannotHoldError): use a
commit point there.

Every function takes a path or any fsspec URL; plain reads and writes are in rigging.filesystem.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import fsspec.asyn
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from rigging.errors import RiggingError
from rigging.filesystem import (
    atomic_write,
    create_local_file,
    filesystem,
    fsync,
    is_s3_filesystem,
    read_all,
    read_local_bytes,
    temporary_name_for,
    write_all,
)


def _is_gcs(fs: fsspec.AbstractFileSystem) -> bool:
    core = sys.modules.get("gcsfs.core")  # the base of gcsfs's filesystems, whichever one gcsfs exports
    return core is not None and isinstance(fs, core.GCSFileSystem)


@dataclass(frozen=True)
class Versioned:
    """A file's bytes and their version: an opaque token to hand back to a conditional write."""

    data: bytes
    version: str


class CannotHoldError(RiggingError):
    """The storage cannot hold a file's lock across other work: only local disk with ``flock`` can."""


class ConditionalWritesUnsupportedError(RiggingError):
    """The URL's filesystem cannot create, replace or delete a file under a condition it checks itself."""

    def __init__(self, url: str, protocol: str, missing: str) -> None:
        self.url, self.protocol, self.missing = url, protocol, missing
        super().__init__(
            f"{url!r} is on {protocol}://, where {missing}; conditional writes work on local disk, s3://, gs:// "
            "and memory:// (within one process)"
        )


def _content_version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _LocalDisk:
    def create(self, fs: Any, path: str, payload: bytes) -> bool:
        # Write a private file, then hard-link it into place: link() fails if the target exists,
        # and a reader never sees the file before its content is complete.
        temp_path = temporary_name_for(path)
        descriptor = create_local_file(temp_path)
        try:
            write_all(descriptor, payload)
        finally:
            os.close(descriptor)
        try:
            os.link(temp_path, path)
        except FileExistsError:
            return False
        except OSError:
            # Filesystems without hard links: O_EXCL is still exclusive, only not all-at-once.
            try:
                descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            try:
                write_all(descriptor, payload)
            finally:
                os.close(descriptor)
        finally:
            os.remove(temp_path)
        return True

    def read(self, fs: Any, path: str) -> Versioned | None:
        try:
            data = read_local_bytes(path)
        except FileNotFoundError:
            return None
        return Versioned(data, _content_version(data))

    def replace(self, fs: Any, path: str, payload: bytes, version: str) -> str | None:
        with self._locked(path) as current:
            if current is None or _content_version(current) != version:
                return None
            return self.write_locked(path, payload)

    def write_locked(self, path: str, payload: bytes) -> str:
        """Replace ``path`` with ``payload``, its lock held by the caller; the new version."""
        try:
            atomic_write(path, payload)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._overwrite_in_place(path, payload):
                raise
        return _content_version(payload)

    @staticmethod
    def _overwrite_in_place(path: str, payload: bytes) -> bool:
        """Rewrite ``path`` inside the blocks it already has; False when ``payload`` needs more.

        A full disk has no room for the temporary copy an atomic replace writes, yet the record that
        says why a run failed matters most then: a small record fits in its own file's blocks. A
        reader may see it half-written for a moment (and reads it as unreadable, not as another record).
        """
        try:
            allocated = os.stat(path).st_blocks * 512
        except FileNotFoundError:
            return False
        if len(payload) > allocated:
            return False
        with open(path, "r+b") as handle:
            handle.write(payload)
            handle.truncate()
            handle.flush()
            fsync(handle.fileno())
        return True

    @staticmethod
    @contextlib.contextmanager
    def _locked(path: str, *, required: bool = False) -> Iterator[bytes | None]:
        """Hold an exclusive lock on the file now at ``path``; yields its bytes (``None``: no file).

        The lock belongs to the inode. A writer that waited while another replaced the file finds
        that the path names a new inode, and locks that one instead, so waiters never act on a
        version that is gone. Where ``flock`` is refused the bytes come unlocked, or, ``required``,
        :class:`CannotHoldError` is raised.
        """
        while True:
            try:
                descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                yield None
                return
            try:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX)
                except OSError as exc:  # no flock here: compare and write stay two steps (module docstring)
                    if required:
                        raise CannotHoldError(f"{path}: this filesystem refuses flock ({exc}), so the file cannot "
                                              "be held across other work") from exc
                    yield read_all(descriptor)
                    return
                try:
                    now = os.stat(path)
                except FileNotFoundError:
                    now = None
                held = os.fstat(descriptor)
                if now is not None and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
                    yield read_all(descriptor)
                    return
            finally:
                os.close(descriptor)
            # Replaced or removed while this waited (closing the descriptor released its lock): look again.

    def remove(self, fs: Any, path: str, version: str) -> bool:
        with self._locked(path) as current:
            if current is None or _content_version(current) != version:
                return False
            # Renamed aside first (atomic), so a remover that got no lock still takes a file only once.
            private = temporary_name_for(path)
            try:
                os.rename(path, private)
            except FileNotFoundError:
                return False
            moved = read_local_bytes(private)
            if _content_version(moved) != version:
                # Moved a file someone had just replaced: put it back, unless it was replaced again.
                with contextlib.suppress(FileExistsError):
                    os.link(private, path)
                os.remove(private)
                return False
            os.remove(private)
            return True


class _Memory:
    _lock = threading.Lock()

    def create(self, fs: Any, path: str, payload: bytes) -> bool:
        with self._lock:
            if fs.exists(path):
                return False
            fs.pipe_file(path, payload)
            return True

    def read(self, fs: Any, path: str) -> Versioned | None:
        try:
            data = fs.cat_file(path)
        except FileNotFoundError:
            return None
        return Versioned(data, _content_version(data))

    def replace(self, fs: Any, path: str, payload: bytes, version: str) -> str | None:
        with self._lock:
            current = self.read(fs, path)
            if current is None or current.version != version:
                return None
            fs.pipe_file(path, payload)
            return _content_version(payload)

    def remove(self, fs: Any, path: str, version: str) -> bool:
        with self._lock:
            current = self.read(fs, path)
            if current is None or current.version != version:
                return False
            fs.rm_file(path)
            return True


def _condition_failed(error: BaseException) -> bool:
    """Whether an S3 request was refused because its condition did not hold (412), or because
    another conditional request on the same key was in flight (409); s3fs keeps boto's error as the cause."""
    response = getattr(error.__cause__, "response", None) or getattr(error, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


async def _s3_get_object(fs: Any, bucket: str, key: str) -> tuple[bytes, str]:
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    try:
        return await response["Body"].read(), response["ETag"]
    finally:
        response["Body"].close()


def _s3_conditional(fs: Any, path: str, operation: str, *, absent_fails: bool = False, **params: Any) -> dict | None:
    """One conditional request on the object at ``path``: its response, or None when the store refused
    it because the condition did not hold (or, with ``absent_fails``, because the object is gone)."""
    bucket, key, _ = fs.split_path(path)
    try:
        return fs.call_s3(operation, Bucket=bucket, Key=key, **params)
    except OSError as error:
        if _condition_failed(error) or (absent_fails and isinstance(error, FileNotFoundError)):
            return None
        raise
    finally:
        fs.invalidate_cache(path)


class _S3:
    """Conditional requests; the version is the object's ETag."""

    def create(self, fs: Any, path: str, payload: bytes) -> bool:
        return _s3_conditional(fs, path, "put_object", Body=payload, IfNoneMatch="*") is not None

    def read(self, fs: Any, path: str) -> Versioned | None:
        bucket, key, _ = fs.split_path(path)
        try:
            data, etag = fsspec.asyn.sync(fs.loop, _s3_get_object, fs, bucket, key)
        except FileNotFoundError:
            return None
        return Versioned(data, etag)

    def replace(self, fs: Any, path: str, payload: bytes, version: str) -> str | None:
        response = _s3_conditional(fs, path, "put_object", absent_fails=True, Body=payload, IfMatch=version)
        return None if response is None else response["ETag"]

    def remove(self, fs: Any, path: str, version: str) -> bool:
        return _s3_conditional(fs, path, "delete_object", absent_fails=True, IfMatch=version) is not None


# The request parameters the S3 operations need. s3fs silently drops parameters its botocore does
# not know, which would turn a conditional request into a plain one: so check that it knows them.
_S3_CONDITIONS = {"PutObject": ("IfNoneMatch", "IfMatch"), "DeleteObject": ("IfMatch",)}


def _s3_unsupported(fs: Any) -> str | None:
    """Why this s3fs cannot send the conditions (its botocore does not know them), or None when it can."""
    model = fs.s3.meta.service_model
    unknown = [
        f"{operation} {name}"
        for operation, names in _S3_CONDITIONS.items()
        for name in names
        if name not in model.operation_model(operation).input_shape.members
    ]
    if not unknown:
        return None
    import botocore

    return (
        f"the installed botocore ({botocore.__version__}) cannot send {', '.join(unknown)}, so s3fs would "
        "drop these conditions silently; upgrade botocore and aiobotocore"
    )


def _gcs_condition_failed(error: BaseException) -> bool:
    """Whether a GCS request was refused because its generation precondition did not hold (412):
    gcsfs raises FileExistsError for it (since 2024.12), older versions an HttpError with the code."""
    return isinstance(error, FileExistsError) or getattr(error, "code", None) == 412


def _gcs_request(fs: Any, method: str, path: str, *args: str, **kwargs: Any) -> Any:
    """One JSON-API request through gcsfs (its authentication and retries); query parameters as kwargs."""
    return fsspec.asyn.sync(fs.loop, fs._call, method, path, *args, **kwargs)


class _GCS:
    """Generation preconditions; the version is the object's generation."""

    def create(self, fs: Any, path: str, payload: bytes) -> bool:
        return self._upload(fs, path, payload, if_generation_match="0") is not None

    def read(self, fs: Any, path: str) -> Versioned | None:
        bucket, key, _ = fs.split_path(path)
        try:
            headers, data = _gcs_request(fs, "GET", "b/{}/o/{}", bucket, key, alt="media")
        except FileNotFoundError:
            return None
        generation = headers.get("x-goog-generation")
        if not generation:
            raise OSError(f"gs://{path}: the store's reply names no generation (x-goog-generation)")
        return Versioned(data, generation)

    def replace(self, fs: Any, path: str, payload: bytes, version: str) -> str | None:
        return self._upload(fs, path, payload, if_generation_match=version)

    def remove(self, fs: Any, path: str, version: str) -> bool:
        bucket, key, _ = fs.split_path(path)
        try:
            _gcs_request(fs, "DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=version)
        except FileNotFoundError:
            return False
        except Exception as error:
            if _gcs_condition_failed(error):
                return False
            raise
        finally:
            fs.invalidate_cache(path)
        return True

    def _upload(self, fs: Any, path: str, payload: bytes, if_generation_match: str) -> str | None:
        """One multipart upload (metadata, then content) under the precondition; the new generation."""
        bucket, key, _ = fs.split_path(path)
        boundary = uuid.uuid4().hex
        body = b"".join([
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            json.dumps({"name": key}).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            payload,
            f"\r\n--{boundary}--\r\n".encode(),
        ])
        try:
            resource = _gcs_request(
                fs, "POST", f"{fs._location}/upload/storage/v1/b/{{}}/o", bucket,
                uploadType="multipart", ifGenerationMatch=if_generation_match, data=body, json_out=True,
                headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
            )
        except Exception as error:
            if _gcs_condition_failed(error):
                return None
            raise
        finally:
            fs.invalidate_cache(path)
        return str(resource["generation"])


# What the GCS operations use of gcsfs's filesystem: its JSON-API request method, the endpoint it
# sends to, and its path and cache helpers. All are internal to gcsfs (2024.12 through 2026.10 have
# them): a gcsfs without them is refused up front rather than failing halfway through a takeover.
_GCS_REQUESTS = ("_call", "_location", "split_path", "invalidate_cache")


def _gcs_unsupported(fs: Any) -> str | None:
    """Why this gcsfs cannot send the generation preconditions, or None when it can."""
    absent = [name for name in _GCS_REQUESTS if not hasattr(fs, name)]
    if not absent:
        return None
    import gcsfs

    return (
        f"the installed gcsfs ({gcsfs.__version__}) lacks {', '.join(absent)}, through which the generation "
        "preconditions are sent; install a gcsfs that has them (2024.12 to 2026.10 do)"
    )


_LOCAL_DISK, _MEMORY, _S3_STORE, _GCS_STORE = _LocalDisk(), _Memory(), _S3(), _GCS()


def _conditional_store(url: str) -> tuple[_LocalDisk | _Memory | _S3 | _GCS, Any, str]:
    fs, path = filesystem(url)
    if isinstance(fs, LocalFileSystem):
        return _LOCAL_DISK, fs, path
    if isinstance(fs, MemoryFileSystem):
        return _MEMORY, fs, path
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if is_s3_filesystem(fs):
        store, missing = _S3_STORE, _s3_unsupported(fs)
    elif _is_gcs(fs):
        store, missing = _GCS_STORE, _gcs_unsupported(fs)
    else:
        store, missing = None, f"the filesystem ({type(fs).__name__}) offers no create-if-absent or compare-and-swap"
    if store is not None and missing is None:
        return store, fs, path
    raise ConditionalWritesUnsupportedError(str(url), protocol, missing)


def check_conditional_writes(url: str) -> None:
    """Raise :class:`ConditionalWritesUnsupportedError` unless ``url``'s filesystem supports the
    conditional writes (see the list at the top of this module)."""
    _conditional_store(url)


def create_exclusive(url: str, data: str | bytes) -> bool:
    """Create ``url`` holding ``data`` only if it does not exist; True when this call created it.

    Exclusive between processes (and machines, on a shared disk or S3). Refuses filesystems that
    cannot do it (:class:`ConditionalWritesUnsupportedError`) rather than check, then write.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    store, fs, path = _conditional_store(url)
    return store.create(fs, path, payload)


def read_versioned(url: str) -> Versioned | None:
    """The file's bytes and version (for :func:`replace_if_unchanged` / :func:`remove_if_unchanged`),
    read together in one request; ``None`` if it does not exist."""
    store, fs, path = _conditional_store(url)
    return store.read(fs, path)


def replace_if_unchanged(url: str, data: str | bytes, version: str) -> str | None:
    """Replace ``url`` with ``data`` only if it still is ``version``; the new version, or ``None``
    when it changed or is gone (then nothing was written)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    store, fs, path = _conditional_store(url)
    return store.replace(fs, path, payload, version)


def remove_if_unchanged(url: str, version: str) -> bool:
    """Delete ``url`` only if it still is ``version``; True when this call deleted it."""
    store, fs, path = _conditional_store(url)
    return store.remove(fs, path, version)


class HeldFile:
    """A file :func:`held` holds: its bytes and version as held, and :meth:`replace`, once, before it is let go."""

    def __init__(self, path: str, data: bytes) -> None:
        self._path = path
        self.data = data
        self.version = _content_version(data)
        self._replaced = False

    def replace(self, data: str | bytes) -> str:
        """Replace the file with ``data`` (atomically, as :func:`replace_if_unchanged` would); the new version.

        Once only: the lock held belongs to the version replaced, so a second write would be unguarded.
        """
        if self._replaced:
            raise RuntimeError(f"{self._path} was replaced already while held; hold it again to write it again")
        self._replaced = True
        return _LOCAL_DISK.write_locked(self._path, data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def held(url: str) -> Iterator[HeldFile | None]:
    """Hold the file ``url`` for the block: no conditional write or delete of it (by any process of
    this machine; on NFS, by any client) lands before the block ends. Yields it as it is while held
    (a :class:`HeldFile`, to read and replace), or ``None`` when there is no file (nothing is held).

    Raises :class:`CannotHoldError` on storage that cannot hold a file across other work: every
    backend but local disk, and a local mount that refuses ``flock``.
    """
    store, fs, path = _conditional_store(url)
    if store is not _LOCAL_DISK:
        raise CannotHoldError(f"{url}: only a file on local disk can be held across other work, not on {type(fs).__name__}")
    with _LOCAL_DISK._locked(path, required=True) as current:
        yield None if current is None else HeldFile(path, current)
