"""One way to touch files, local or remote: thin helpers over fsspec.

Every function takes a path or any fsspec URL (``gs://``, ``s3://``, ``memory://``...). Writes that
others may read concurrently go through :func:`atomic_write` / :func:`atomic_open`, so a reader
sees either the old content or the new, never a half-written file. Leases build on the conditional
writes at the end (create if absent, replace or delete if unchanged), which only some backends offer.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import fsspec
import fsspec.asyn
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
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
    try:
        fs, path = fsspec.core.url_to_fs(str(url))
    except (ValueError, ImportError):
        check_protocol(url)  # says which package to install, or that the protocol is unknown
        raise
    return fs, path


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
    return f"{folder}{separator}.{name}{TEMPORARY_MARKER}{uuid.uuid4().hex[:12]}"


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
    try:
        found = fs.find(root)
    except FileNotFoundError:
        return []
    return sorted(f[len(root) + 1 :] for f in found if f.startswith(root + "/"))


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


def atomic_write(url: str, data: str | bytes) -> None:
    """Replace ``url`` with ``data`` so that readers never observe a partial file.

    Local disk: a temporary sibling renamed over the target. Elsewhere: one upload of the whole
    content, which an object store publishes only once it is complete.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fs, path = filesystem(url)
    if isinstance(fs, LocalFileSystem):
        with atomic_open(url, "wb") as handle:
            handle.write(payload)
        return
    fs.pipe_file(path, payload)


@contextlib.contextmanager
def atomic_open(url: str, mode: str = "wb") -> Iterator[IO]:
    """Open ``url`` for writing; the file appears (or is replaced) only when the block succeeds.

    Writes stream, so memory stays bounded whatever the size. If the block raises, nothing changes.

    * Local disk: a temporary sibling, ``os.replace``d over the target (atomic on POSIX).
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
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        temp_path = temporary_name_for(path)
        try:
            with open(temp_path, mode, encoding="utf-8" if mode == "w" else None) as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp_path, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp_path)
            raise
        return
    if _is_s3(fs):
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


def _is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    s3fs = sys.modules.get("s3fs")  # an S3 filesystem can exist only once s3fs is imported
    return s3fs is not None and isinstance(fs, s3fs.S3FileSystem)


def _is_gcs(fs: fsspec.AbstractFileSystem) -> bool:
    core = sys.modules.get("gcsfs.core")  # the base of gcsfs's filesystems, whichever one gcsfs exports
    return core is not None and isinstance(fs, core.GCSFileSystem)


# -- conditional writes ---------------------------------------------------------------------------
#
# A lease (rigging.lease) is safe only if its lock file changes under conditions that the store
# itself checks: create it only if absent; replace or delete it only if it still is the version the
# caller read. Which backends offer that, and how, is decided here and nowhere else:
#
#   local disk  create: hard link of a complete temporary file (the kernel refuses an existing
#               target, between processes and over NFS). delete: rename aside (one renamer wins),
#               compare, then remove or put back. replace: compare, then ``os.replace``: a change
#               made between the two is overwritten (a window of one local read).
#   s3://       PutObject with If-None-Match: *, PutObject and DeleteObject with If-Match: <ETag>.
#               AWS S3 honours all three (conditional deletes since September 2025), and so does
#               moto. An S3-compatible store that ignores these headers is not safe, and this cannot
#               tell. Refused where the installed botocore cannot send them (_S3_CONDITIONS).
#   memory://   every operation under one lock, so exact between threads. The store lives inside one
#               process: no other process sees the lock at all.
#   gs://       JSON-API requests with ifGenerationMatch: 0 to create (a multipart upload), the
#               generation read to replace (the same upload) or delete. GCS honours all three; the
#               test server (fake-gcs-server) honours the two uploads but not the delete. Refused where
#               gcsfs no longer offers the request methods they are sent through (_GCS_REQUESTS).
#   any other   refused (ConditionalWritesUnsupportedError): a check-then-write would let two
#               writers both believe they won.


@dataclass(frozen=True)
class Versioned:
    """A file's bytes and their version: an opaque token to hand back to a conditional write."""

    data: bytes
    version: str


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
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        # Write a private file, then hard-link it into place: link() fails if the target exists,
        # and a reader never sees the file before its content is complete.
        temp_path = temporary_name_for(path)
        with open(temp_path, "wb") as handle:
            handle.write(payload)
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
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(payload)
        finally:
            os.remove(temp_path)
        return True

    def read(self, fs: Any, path: str) -> Versioned | None:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        return Versioned(data, _content_version(data))

    def replace(self, fs: Any, path: str, payload: bytes, version: str) -> str | None:
        current = self.read(fs, path)
        if current is None or current.version != version:
            return None
        atomic_write(path, payload)
        return _content_version(payload)

    def remove(self, fs: Any, path: str, version: str) -> bool:
        # Renamed aside first (atomic): of two removers of the same file only one finds it.
        private = temporary_name_for(path)
        try:
            os.rename(path, private)
        except FileNotFoundError:
            return False
        with open(private, "rb") as handle:
            moved = handle.read()
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


class _S3:
    """Conditional requests; the version is the object's ETag."""

    def create(self, fs: Any, path: str, payload: bytes) -> bool:
        bucket, key, _ = fs.split_path(path)
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=payload, IfNoneMatch="*")
        except OSError as error:
            if _condition_failed(error):
                return False
            raise
        finally:
            fs.invalidate_cache(path)
        return True

    def read(self, fs: Any, path: str) -> Versioned | None:
        bucket, key, _ = fs.split_path(path)
        try:
            data, etag = fsspec.asyn.sync(fs.loop, _s3_get_object, fs, bucket, key)
        except FileNotFoundError:
            return None
        return Versioned(data, etag)

    def replace(self, fs: Any, path: str, payload: bytes, version: str) -> str | None:
        bucket, key, _ = fs.split_path(path)
        try:
            response = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=payload, IfMatch=version)
        except FileNotFoundError:
            return None
        except OSError as error:
            if _condition_failed(error):
                return None
            raise
        finally:
            fs.invalidate_cache(path)
        return response["ETag"]

    def remove(self, fs: Any, path: str, version: str) -> bool:
        bucket, key, _ = fs.split_path(path)
        try:
            fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version)
        except FileNotFoundError:
            return False
        except OSError as error:
            if _condition_failed(error):
                return False
            raise
        finally:
            fs.invalidate_cache(path)
        return True


# The request parameters the S3 operations need. s3fs silently drops parameters its botocore does
# not know, which would turn a conditional request into a plain one: so check that it knows them.
_S3_CONDITIONS = {"PutObject": ("IfNoneMatch", "IfMatch"), "DeleteObject": ("IfMatch",)}


def _s3_conditions_unknown(fs: Any) -> list[str]:
    model = fs.s3.meta.service_model
    return [
        f"{operation} {name}"
        for operation, names in _S3_CONDITIONS.items()
        for name in names
        if name not in model.operation_model(operation).input_shape.members
    ]


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


def _gcs_requests_missing(fs: Any) -> list[str]:
    return [name for name in _GCS_REQUESTS if not hasattr(fs, name)]


_LOCAL_DISK, _MEMORY, _S3_STORE, _GCS_STORE = _LocalDisk(), _Memory(), _S3(), _GCS()


def _conditional_store(url: str) -> tuple[_LocalDisk | _Memory | _S3 | _GCS, Any, str]:
    fs, path = filesystem(url)
    if isinstance(fs, LocalFileSystem):
        return _LOCAL_DISK, fs, path
    if isinstance(fs, MemoryFileSystem):
        return _MEMORY, fs, path
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if _is_s3(fs):
        unknown = _s3_conditions_unknown(fs)
        if not unknown:
            return _S3_STORE, fs, path
        import botocore

        missing = (
            f"the installed botocore ({botocore.__version__}) cannot send {', '.join(unknown)}, so s3fs would "
            "drop these conditions silently; upgrade botocore and aiobotocore"
        )
    elif _is_gcs(fs):
        absent = _gcs_requests_missing(fs)
        if not absent:
            return _GCS_STORE, fs, path
        import gcsfs

        missing = (
            f"the installed gcsfs ({gcsfs.__version__}) lacks {', '.join(absent)}, through which the generation "
            "preconditions are sent; install a gcsfs that has them (2024.12 to 2026.10 do)"
        )
    else:
        missing = f"the filesystem ({type(fs).__name__}) offers no create-if-absent or compare-and-swap"
    raise ConditionalWritesUnsupportedError(str(url), protocol, missing)


def check_conditional_writes(url: str) -> None:
    """Raise :class:`ConditionalWritesUnsupportedError` unless ``url``'s filesystem supports the
    conditional writes below (see the list above)."""
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
