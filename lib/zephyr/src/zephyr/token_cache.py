"""The token cache: tokenized documents stored as flat token arrays plus document offsets.

Layout of a cache folder (a local path or any fsspec URL)::

    <cache>/ledger.json              written last, atomically, once every shard is finished
    <cache>/shard-00000/tokens.bin   little-endian token ids (uint16 if vocab_size <= 65536, else uint32)
    <cache>/shard-00000/offsets.bin  little-endian int64, documents + 1 entries: 0, end of doc 0, ...
    <cache>/shard-00000/loss_mask.bin  optional: one uint8 per token, 1 where the token is trained on
    <cache>/shard-00000/shard.json   written last for the shard: counts, dtype, max token id, checksums

A shard without ``shard.json`` is incomplete and is never read or counted; a cache without
``ledger.json`` is incomplete and :meth:`TokenCache.open` refuses it. Because the arrays are raw
and fixed-width, any flat token range is found by index arithmetic and read without touching the
rest of the cache (a memory map locally, a byte-range request remotely).

Integrity. The writer hashes each array (xxh3-64) and tracks the shard's largest token id as the
bytes go out, so recording them costs no extra pass; both go into ``shard.json`` and the ledger.
xxh3 hashes at ~24 GB/s on one core, so a check is bound by how fast the bytes arrive (crc32 runs
at 3-4 GB/s, blake2b below 1 GB/s); it guards against accidents (bit rot, truncated copies,
edits), not against an adversary.

Policy: :meth:`TokenCache.open` always checks the ledger's shape and every file's size (a few
metadata calls per shard, ~1 ms for a 4-shard local cache) and, by default, streams every file
through the hash in 8 MiB chunks, several shards at a time. That costs what reading the cache once
costs; measured on a 2-core machine (``bench/token_cache_checksum.py``): 0.12-0.19 s per GB
(5-8 GB/s) with the files in the page cache, ~0.5 s per GB (~2 GB/s) read from local disk;
remotely, the time to download the cache. Hashing while writing adds ~0.09 s per GB, under 1% of
a write. ``verify_checksums=False`` skips the hashing (sizes are still checked) for caches too
large to read at every training start. A matching checksum does not prove the recorded largest
id (tokens replaced and their checksums recomputed still match), so verification also takes the
largest id from the chunks it hashes (~0.04 s per GB more: 0.172 -> 0.181 s for 256 MB, warm),
and :meth:`TokenCache.check_token_ids` compares that with a model's vocabulary; unverified, it
has only the recorded id, and a reader that knows the model's vocabulary checks the ids it reads
(``levanter.data.windows``).

Loss masks. A cache may carry a per-token loss mask beside its tokens (``loss_mask.bin``, one
byte per token: 1 where predicting that token is trained on, 0 where the token is context only,
such as the user's turns of a conversation). Every shard of such a cache has one, covered by the
shard's checksums and size checks like the other arrays, and the ledger says format
``marin-token-cache/3``, so a reader that does not know masks refuses the cache instead of
silently training on every token. A cache without masks is still written as format
``marin-token-cache/2``, byte for byte as before, and reads as all ones.

A ledger is data: shard paths in it must be plain relative folders inside the cache (no absolute
paths, ``..`` or URLs), so a ledger can never direct reads elsewhere. Caches of format
``marin-token-cache/1`` carry no checksums and are refused with a request to re-tokenize rather
than trusted unverified.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash
from rigging.filesystem import atomic_open

from zephyr._fs import (
    atomic_write_text,
    is_local,
    is_temporary_name,
    join_url,
    remove_if_exists,
    url_to_fs,
)
from zephyr.errors import ZephyrError

logger = logging.getLogger(__name__)

FORMAT = "marin-token-cache/2"
# Format 2 plus a per-token loss mask in every shard; only caches that carry masks are written so.
FORMAT_WITH_LOSS_MASK = "marin-token-cache/3"
# Formats this reader knows but refuses, with the reason given to the user.
_REFUSED_FORMATS = {
    "marin-token-cache/1": "it was written before token caches recorded checksums, so its files cannot be verified",
}
LEDGER_NAME = "ledger.json"
SHARD_SUMMARY_NAME = "shard.json"
TOKENS_NAME = "tokens.bin"
OFFSETS_NAME = "offsets.bin"
LOSS_MASK_NAME = "loss_mask.bin"
_OFFSET_DTYPE = np.dtype("<i8")
_LOSS_MASK_DTYPE = np.dtype("u1")
# Documents are buffered up to this many tokens before a write, so a shard of any size streams to
# disk with bounded memory.
_WRITE_CHUNK_TOKENS = 1 << 20
CHECKSUM_ALGORITHM = "xxh3_64"
_new_hasher = xxhash.xxh3_64
# Verification reads each file in chunks of this size (bounded memory for any shard size), and
# several shards at once: remote stores give more throughput to parallel streams.
_VERIFY_CHUNK_BYTES = 8 << 20
_VERIFY_THREADS = 8
_PROGRESS_EVERY_SECONDS = 10.0


class TokenCacheError(ZephyrError):
    """Base class for token-cache problems."""


class IncompleteTokenCacheError(TokenCacheError):
    """The cache (or a shard of it) was never finished: a writer crashed or is still running."""


class CorruptTokenCacheError(TokenCacheError):
    """The files of a finished cache disagree with its ledger, or the ledger itself is damaged."""


class OutdatedTokenCacheError(TokenCacheError):
    """The cache was written in an older format that this reader refuses."""


class TokenIdOutOfRangeError(TokenCacheError):
    """The cache holds token ids that the model's vocabulary does not have."""


def _remedy(cache_url: str) -> str:
    return (
        f"delete the cache folder {cache_url} and rerun the step that wrote it (for a tokenize step, delete "
        "that step's whole output folder, so the runner does not skip it as already done)"
    )


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The narrowest token dtype that holds every id below ``vocab_size``."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _normalize_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind != "u" or dt.itemsize not in (2, 4):
        raise ValueError(f"token dtype must be uint16 or uint32, got {dt}")
    return dt.newbyteorder("<")


def _dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name  # "uint16" / "uint32"; byte order is always little-endian on disk


@dataclass(frozen=True)
class ShardSummary:
    """What a finished shard holds; the content of its ``shard.json``.

    ``max_token_id`` is None for a shard without tokens; ``checksums`` maps each array's file name
    to ``"xxh3_64:<hex digest>"`` of its bytes.
    """

    path: str
    documents: int
    tokens: int
    dtype: str
    max_token_id: int | None = None
    checksums: Mapping[str, str] = field(default_factory=dict)

    @property
    def has_loss_mask(self) -> bool:
        return LOSS_MASK_NAME in self.checksums

    def record(self) -> dict[str, Any]:
        """The JSON record, without the path (``shard.json``; the ledger adds the relative path)."""
        return {
            "documents": self.documents,
            "tokens": self.tokens,
            "dtype": self.dtype,
            "max_token_id": self.max_token_id,
            "checksums": dict(self.checksums),
        }


def read_shard_summary(shard_url: str) -> ShardSummary | None:
    """The summary of a finished shard, or None if the shard is missing, incomplete or of an older format."""
    summary_url = join_url(shard_url, SHARD_SUMMARY_NAME)
    fs, path = url_to_fs(summary_url)
    try:
        with fs.open(path, "rb") as handle:
            data = json.loads(handle.read())
        if "checksums" not in data:
            # Written before shards recorded checksums: treated as unfinished, so a resumed write redoes it.
            logger.info("%s has no checksums (an older format); the shard will be rewritten", summary_url)
            return None
        return ShardSummary(
            path=shard_url,
            documents=int(data["documents"]),
            tokens=int(data["tokens"]),
            dtype=data["dtype"],
            max_token_id=None if data["max_token_id"] is None else int(data["max_token_id"]),
            checksums=dict(data["checksums"]),
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptTokenCacheError(
            f"{summary_url} is not a valid shard summary ({error}); delete the shard folder {shard_url} "
            "and rerun the step that writes it"
        ) from None


class TokenCacheShardWriter:
    """Streams documents into one shard; ``shard.json`` appears only after :meth:`finish`.

    Use as a context manager: leaving the block normally finishes the shard, leaving it with an
    exception discards the partial files (the shard stays absent/incomplete).

    With ``loss_mask=True`` every document comes with its per-token loss mask (see the module
    docstring), written to ``loss_mask.bin`` beside the tokens.
    """

    def __init__(self, url: str, dtype: Any, *, loss_mask: bool = False):
        self.url = str(url).rstrip("/")
        self.dtype = _normalize_dtype(dtype)
        self.has_loss_mask = bool(loss_mask)
        self._max_id = np.iinfo(self.dtype).max
        # A rewrite must never look finished while its files are being replaced.
        remove_if_exists(join_url(self.url, SHARD_SUMMARY_NAME))
        _remove_stale_temporaries(self.url)
        if not self.has_loss_mask:  # a mask left by an earlier write of this shard would belong to other tokens
            remove_if_exists(join_url(self.url, LOSS_MASK_NAME))
        names = (TOKENS_NAME, OFFSETS_NAME) + ((LOSS_MASK_NAME,) if self.has_loss_mask else ())
        self._file_cms = {name: atomic_open(join_url(self.url, name), "wb") for name in names}
        self._files = {name: cm.__enter__() for name, cm in self._file_cms.items()}
        self._hashers = {name: _new_hasher() for name in names}
        self._largest_id = -1
        self._pending_tokens: list[np.ndarray] = []
        self._pending_masks: list[np.ndarray] = []
        self._pending_ends: list[int] = []
        self._pending_count = 0
        self._documents = 0
        self._tokens = 0
        self._closed = False
        self._write_bytes(OFFSETS_NAME, np.zeros(1, dtype=_OFFSET_DTYPE).tobytes())

    def write(self, document: Sequence[int] | np.ndarray, loss_mask: Sequence[int] | np.ndarray | None = None) -> None:
        """Append one document's token ids (and, for a writer with loss masks, its 0/1 mask per token)."""
        ids = np.asarray(document)
        mask = self._checked_mask(ids, loss_mask)
        if ids.ndim != 1:
            raise ValueError(f"a document must be a 1-D sequence of token ids, got shape {ids.shape}")
        if ids.size:
            if ids.dtype.kind not in "iu":
                raise ValueError(f"token ids must be integers, got dtype {ids.dtype}")
            if ids.dtype != self.dtype:
                low, high = int(ids.min()), int(ids.max())
                if low < 0 or high > self._max_id:
                    raise ValueError(
                        f"token id out of range for {self.dtype.name} in document {self._documents} "
                        f"(min {low}, max {high}); was the cache's vocab_size set correctly?"
                    )
                ids = ids.astype(self.dtype)
            self._pending_tokens.append(ids)
            if mask is not None:
                self._pending_masks.append(mask)
        self._tokens += int(ids.size)
        self._documents += 1
        self._pending_ends.append(self._tokens)
        self._pending_count += int(ids.size)
        if self._pending_count >= _WRITE_CHUNK_TOKENS or len(self._pending_ends) >= 65536:
            self._flush()

    def _checked_mask(self, ids: np.ndarray, loss_mask: Any) -> np.ndarray | None:
        """The document's mask as uint8 0/1, or None for a writer without masks."""
        if not self.has_loss_mask:
            if loss_mask is not None:
                raise ValueError(
                    "a loss mask was given to a token cache writer without loss masks; create the writer (or "
                    "write_token_cache) with loss_mask=True"
                )
            return None
        if loss_mask is None:
            raise ValueError(f"document {self._documents} has no loss mask, but this token cache writer stores one per token")
        mask = np.asarray(loss_mask)
        if mask.shape != ids.shape:
            raise ValueError(
                f"document {self._documents} has {ids.size} tokens but a loss mask of shape {mask.shape}; the mask "
                "needs one 0/1 value per token"
            )
        if mask.size:
            if mask.dtype.kind not in "biu":
                raise ValueError(f"document {self._documents}: a loss mask holds the integers 0 and 1, got dtype {mask.dtype}")
            low, high = int(mask.min()), int(mask.max())
            if low < 0 or high > 1:
                raise ValueError(f"document {self._documents}: a loss mask holds 0s and 1s only, got values {low}..{high}")
        return mask.astype(_LOSS_MASK_DTYPE, copy=False)

    def write_many(self, documents: Iterable[Any]) -> None:
        """Append documents: token arrays, or ``(tokens, loss_mask)`` pairs for a writer with loss masks."""
        if self.has_loss_mask:
            for ids, mask in documents:
                self.write(ids, mask)
        else:
            for document in documents:
                self.write(document)

    def _write_bytes(self, name: str, data: bytes) -> None:
        # Hashing the buffer on its way out is what makes checksums free: no second read of the file.
        self._hashers[name].update(data)
        self._files[name].write(data)

    def _flush(self) -> None:
        if self._pending_tokens:
            chunk = np.concatenate(self._pending_tokens)
            self._largest_id = max(self._largest_id, int(chunk.max()))
            self._write_bytes(TOKENS_NAME, chunk.tobytes())
        if self._pending_masks:
            self._write_bytes(LOSS_MASK_NAME, np.concatenate(self._pending_masks).tobytes())
        if self._pending_ends:
            ends = np.asarray(self._pending_ends, dtype=_OFFSET_DTYPE)
            self._write_bytes(OFFSETS_NAME, ends.tobytes())
        self._pending_tokens, self._pending_masks, self._pending_ends, self._pending_count = [], [], [], 0

    def finish(self) -> ShardSummary:
        """Close the arrays, then write ``shard.json``: from here on the shard counts."""
        if self._closed:
            raise RuntimeError("shard writer already closed")
        self._flush()
        self._closed = True
        for cm in self._file_cms.values():
            cm.__exit__(None, None, None)
        summary = ShardSummary(
            self.url,
            self._documents,
            self._tokens,
            _dtype_name(self.dtype),
            max_token_id=self._largest_id if self._largest_id >= 0 else None,
            checksums={name: f"{CHECKSUM_ALGORITHM}:{hasher.hexdigest()}" for name, hasher in self._hashers.items()},
        )
        atomic_write_text(join_url(self.url, SHARD_SUMMARY_NAME), json.dumps(summary.record(), sort_keys=True))
        return summary

    def abort(self) -> None:
        """Discard everything written so far."""
        if self._closed:
            return
        self._closed = True
        error = RuntimeError("token cache shard write aborted")
        for cm in self._file_cms.values():
            try:
                cm.__exit__(RuntimeError, error, None)
            except RuntimeError:
                pass

    def __enter__(self) -> TokenCacheShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if not self._closed:
                self.finish()
        else:
            self.abort()


def _remove_stale_temporaries(shard_url: str) -> None:
    """Delete partial files a killed writer left behind (one writer owns a shard at a time)."""
    fs, path = url_to_fs(shard_url)
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:
        return
    for name in names:
        if is_temporary_name(name):
            fs.rm(name)


def write_token_cache_shard(url: str, documents: Iterable[Any], dtype: Any, *, loss_mask: bool = False) -> ShardSummary:
    """Write one shard from an iterable of documents (each a sequence of token ids, or with
    ``loss_mask=True`` a ``(tokens, loss_mask)`` pair)."""
    with TokenCacheShardWriter(url, dtype, loss_mask=loss_mask) as writer:
        writer.write_many(documents)
        return writer.finish()


def finalize_token_cache(
    cache_url: str,
    shard_paths: Sequence[str],
    *,
    vocab_size: int,
    metadata: dict[str, Any] | None = None,
    loss_mask: bool | None = None,
) -> dict[str, Any]:
    """Check every listed shard is finished and write ``ledger.json`` (last, atomically).

    ``shard_paths`` are shard folders relative to ``cache_url`` (``"shard-00000"``) or full URLs
    under it; their order is the cache's document order. A shard holding an id at or above
    ``vocab_size`` is refused: the ledger would claim a vocabulary its own tokens do not fit.
    ``loss_mask``: whether every shard must carry a loss mask (True) or none may (False); None
    takes the shards' word, which must be the same for all of them.
    """
    cache_url = str(cache_url).rstrip("/")
    expected = _dtype_name(dtype_for_vocab(vocab_size))
    shards = []
    masked: dict[bool, list[str]] = {}
    for shard_path in shard_paths:
        relative = _relative_shard_path(cache_url, str(shard_path))
        summary = read_shard_summary(join_url(cache_url, relative))
        if summary is None:
            raise IncompleteTokenCacheError(
                f"shard {relative!r} of token cache {cache_url} has no {SHARD_SUMMARY_NAME}: it was never "
                "finished; rerun the step that writes it"
            )
        if summary.dtype != expected:
            raise ValueError(
                f"shard {relative!r} stores {summary.dtype} but vocab_size={vocab_size} needs {expected}"
            )
        if summary.max_token_id is not None and summary.max_token_id >= vocab_size:
            raise ValueError(
                f"shard {relative!r} of token cache {cache_url} holds token id {summary.max_token_id}, outside "
                f"vocab_size={vocab_size}; the tokenizer's vocab_size does not cover the ids it produced"
            )
        masked.setdefault(summary.has_loss_mask, []).append(relative)
        shards.append({"path": relative, **summary.record()})
        del shards[-1]["dtype"]  # one dtype for the whole cache, recorded once below
    if len(masked) > 1:
        raise ValueError(
            f"token cache {cache_url} mixes shards with loss masks ({', '.join(masked[True])}) and without "
            f"({', '.join(masked[False])}); a cache has a mask in every shard or in none"
        )
    has_mask = next(iter(masked), bool(loss_mask))
    if loss_mask is not None and has_mask != loss_mask:
        raise ValueError(
            f"the shards of token cache {cache_url} {'carry' if has_mask else 'lack'} loss masks, but the cache "
            f"was to be written {'with' if loss_mask else 'without'} them; rewrite its shards"
        )
    largest = [s["max_token_id"] for s in shards if s["max_token_id"] is not None]
    ledger = {
        "format": FORMAT_WITH_LOSS_MASK if has_mask else FORMAT,
        "dtype": expected,
        "vocab_size": int(vocab_size),
        "documents": sum(s["documents"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "max_token_id": max(largest) if largest else None,
        "shards": shards,
        "metadata": dict(metadata or {}),
    }
    atomic_write_text(join_url(cache_url, LEDGER_NAME), json.dumps(ledger, indent=2, sort_keys=True))
    return ledger


def _relative_shard_path(cache_url: str, shard_path: str) -> str:
    if shard_path.startswith(cache_url + "/"):
        relative = shard_path[len(cache_url) + 1 :].strip("/")
    else:
        relative = shard_path.rstrip("/")
    if not _is_inside_cache(relative):
        raise ValueError(f"shard {shard_path!r} is not a folder inside token cache {cache_url}")
    return relative


def _is_inside_cache(relative: str) -> bool:
    """True for a plain relative folder path: no absolute path, URL, ``..``, ``.`` or empty segment."""
    if not isinstance(relative, str) or not relative or "\\" in relative or ":" in relative:
        return False
    return all(part not in ("", ".", "..") for part in relative.split("/"))


def is_token_cache_complete(url: str) -> bool:
    fs, path = url_to_fs(join_url(url, LEDGER_NAME))
    return fs.exists(path)


def _read_ledger(url: str) -> dict[str, Any]:
    """The ledger of the cache at ``url``, checked for shape; every problem is a :class:`TokenCacheError`."""
    ledger_url = join_url(url, LEDGER_NAME)
    fs, path = url_to_fs(ledger_url)
    try:
        with fs.open(path, "rb") as handle:
            ledger = json.loads(handle.read())
    except FileNotFoundError:
        if not fs.exists(url_to_fs(url)[1]):
            raise FileNotFoundError(f"no token cache at {url}") from None
        raise IncompleteTokenCacheError(
            f"token cache {url} has no {LEDGER_NAME}: it was never finished (a tokenize run crashed "
            "or is still running); rerun the step that writes it"
        ) from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise CorruptTokenCacheError(f"{ledger_url} is not valid JSON ({error}); {_remedy(url)}") from None
    if not isinstance(ledger, dict):
        raise CorruptTokenCacheError(f"{ledger_url} is not a JSON object; {_remedy(url)}")
    format_name = ledger.get("format")
    if format_name in _REFUSED_FORMATS:
        raise OutdatedTokenCacheError(
            f"token cache {url} has format {format_name}: {_REFUSED_FORMATS[format_name]}. Re-tokenize: "
            f"{_remedy(url)}"
        )
    if format_name not in (FORMAT, FORMAT_WITH_LOSS_MASK):
        raise TokenCacheError(
            f"{ledger_url}: unsupported token cache format {format_name!r}, expected {FORMAT} or "
            f"{FORMAT_WITH_LOSS_MASK}; a newer version of this library may have written it, or " + _remedy(url)
        )
    problem = _ledger_problem(ledger)
    if problem:
        raise CorruptTokenCacheError(f"{ledger_url} is damaged: {problem}; {_remedy(url)}")
    return ledger


def _ledger_problem(ledger: dict[str, Any]) -> str | None:
    """What is wrong with a ledger's shape, or None; checked before any field is used."""

    def count(record: Mapping[str, Any], key: str) -> bool:
        value = record.get(key)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    masked = ledger.get("format") == FORMAT_WITH_LOSS_MASK
    if ledger.get("dtype") not in ("uint16", "uint32"):
        return f"'dtype' is {ledger.get('dtype')!r}, not 'uint16' or 'uint32'"
    for key in ("vocab_size", "documents", "tokens"):
        if not count(ledger, key):
            return f"{key!r} is {ledger.get(key)!r}, not a count"
    if ledger["vocab_size"] == 0:
        return "'vocab_size' is 0"
    if not isinstance(ledger.get("metadata"), dict):
        return "'metadata' is not an object"
    if not isinstance(ledger.get("shards"), list):
        return "'shards' is not a list"
    for index, shard in enumerate(ledger["shards"]):
        if not isinstance(shard, dict):
            return f"shard {index} is not an object"
        if not _is_inside_cache(shard.get("path")):
            return (
                f"shard {index} has path {shard.get('path')!r}, which is not a folder inside the cache (a ledger "
                "may only name relative folders inside its own cache: no absolute paths, '..' or URLs)"
            )
        for key in ("documents", "tokens"):
            if not count(shard, key):
                return f"shard {shard['path']!r} has {key!r} {shard.get(key)!r}, not a count"
        if shard.get("max_token_id") is not None and not count(shard, "max_token_id"):
            return f"shard {shard['path']!r} has 'max_token_id' {shard.get('max_token_id')!r}"
        checksums = shard.get("checksums")
        for name in (TOKENS_NAME, OFFSETS_NAME) + ((LOSS_MASK_NAME,) if masked else ()):
            value = checksums.get(name) if isinstance(checksums, dict) else None
            if not (isinstance(value, str) and value.startswith(CHECKSUM_ALGORITHM + ":")):
                return f"shard {shard['path']!r} has no {CHECKSUM_ALGORITHM} checksum for {name}"
        if not masked and LOSS_MASK_NAME in checksums:
            return f"shard {shard['path']!r} lists a loss mask, which format {FORMAT} does not have"
    return None


class _VerifyProgress:
    """Counts bytes hashed across threads; logs rate and ETA now and then for long verifications."""

    def __init__(self, url: str, total_bytes: int):
        self.url, self.total = url, total_bytes
        self.done = 0
        self.started = self._last_log = time.perf_counter()
        self._lock = threading.Lock()

    def advance(self, count: int) -> None:
        with self._lock:
            self.done += count
            now = time.perf_counter()
            if now - self._last_log < _PROGRESS_EVERY_SECONDS:
                return
            self._last_log = now
        rate = self.done / max(now - self.started, 1e-9)
        logger.info(
            "verifying token cache %s: %.2f of %.2f GB (%.2f GB/s, about %.0fs left)",
            self.url, self.done / 1e9, self.total / 1e9, rate / 1e9, (self.total - self.done) / max(rate, 1.0),
        )


def _file_checksum(fs: Any, path: str, progress: _VerifyProgress, token_dtype: np.dtype | None = None) -> tuple[str, int | None]:
    """``"xxh3_64:<hex>"`` of a file, streamed in fixed-size chunks through one reused buffer, and,
    given ``token_dtype``, the largest token id in it (None for an empty file), read from the same chunks."""
    hasher = _new_hasher()
    buffer = bytearray(_VERIFY_CHUNK_BYTES)  # a multiple of 4 bytes, so a chunk never splits a token
    view = memoryview(buffer)
    largest = -1
    with fs.open(path, "rb") as handle:
        while read := handle.readinto(buffer):
            hasher.update(view[:read])
            if token_dtype is not None and read >= token_dtype.itemsize:
                largest = max(largest, int(np.frombuffer(view[: read - read % token_dtype.itemsize], dtype=token_dtype).max()))
            progress.advance(read)
    return f"{CHECKSUM_ALGORITHM}:{hasher.hexdigest()}", (largest if largest >= 0 else None)


class _Shard:
    """Read access to one shard's arrays; memory-mapped locally, byte ranges remotely."""

    def __init__(self, cache_url: str, record: Mapping[str, Any], dtype: np.dtype, has_loss_mask: bool):
        self.cache_url = cache_url
        self.url = join_url(cache_url, record["path"])
        self.documents = int(record["documents"])
        self.tokens = int(record["tokens"])
        self.max_token_id = record.get("max_token_id")
        self.checksums = dict(record["checksums"])
        self.dtype = dtype
        self._fs, self._tokens_path = url_to_fs(join_url(self.url, TOKENS_NAME))
        self._offsets_path = url_to_fs(join_url(self.url, OFFSETS_NAME))[1]
        self.has_loss_mask = has_loss_mask
        self._loss_mask_path = url_to_fs(join_url(self.url, LOSS_MASK_NAME))[1]
        self._local = is_local(self._fs)
        self._token_map: np.ndarray | None = None
        self._offset_map: np.ndarray | None = None
        self._loss_mask_map: np.ndarray | None = None

    def _files(self) -> list[tuple[str, str, int]]:
        """(name, path, size the ledger implies) of each array."""
        files = [
            (TOKENS_NAME, self._tokens_path, self.tokens * self.dtype.itemsize),
            (OFFSETS_NAME, self._offsets_path, (self.documents + 1) * _OFFSET_DTYPE.itemsize),
        ]
        if self.has_loss_mask:
            files.append((LOSS_MASK_NAME, self._loss_mask_path, self.tokens * _LOSS_MASK_DTYPE.itemsize))
        return files

    @property
    def nbytes(self) -> int:
        return sum(size for _, _, size in self._files())

    def _check_size(self, name: str, path: str, expected: int) -> None:
        url = join_url(self.url, name)
        try:
            actual = self._fs.size(path)
        except FileNotFoundError:
            raise CorruptTokenCacheError(
                f"{url} is missing although the ledger lists its shard; {_remedy(self.cache_url)}"
            ) from None
        if actual != expected:
            raise CorruptTokenCacheError(
                f"{url} holds {actual} bytes; the ledger implies {expected} (a truncated or partial copy?); "
                f"{_remedy(self.cache_url)}"
            )

    def verify(self, checksums: bool, progress: _VerifyProgress) -> None:
        """Sizes always; with ``checksums`` also every byte, against the digests the writer recorded."""
        for name, path, expected in self._files():
            self._check_size(name, path, expected)
        if not checksums:
            return
        for name, path, _ in self._files():
            actual, largest = _file_checksum(self._fs, path, progress, self.dtype if name == TOKENS_NAME else None)
            if actual != self.checksums[name]:
                raise CorruptTokenCacheError(
                    f"{join_url(self.url, name)} does not match its checksum in the ledger (recorded "
                    f"{self.checksums[name]}, found {actual}): the file changed after it was written (disk or "
                    f"copy corruption, or an edit); {_remedy(self.cache_url)}"
                )
            if name == TOKENS_NAME and largest != self.max_token_id:
                # A checksum recomputed after the tokens were replaced matches, but the recorded largest
                # id is then stale: the bytes were just read, so their own largest id is what counts.
                logger.warning(
                    "%s records largest token id %s but its tokens hold %s; using the tokens' own.",
                    self.url, self.max_token_id, largest,
                )
                self.max_token_id = largest

    def _map(self, name: str, path: str, dtype: np.dtype, count: int) -> np.ndarray:
        # Checked again here, not only at open: a file replaced since then must not be misread.
        self._check_size(name, path, count * dtype.itemsize)
        if count == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))

    def _read_range(self, path: str, dtype: np.dtype, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros(0, dtype=dtype)
        data = self._fs.cat_file(path, start=start * dtype.itemsize, end=stop * dtype.itemsize)
        return np.frombuffer(data, dtype=dtype)

    def tokens_range(self, start: int, stop: int) -> np.ndarray:
        if self._local:
            if self._token_map is None:
                self._token_map = self._map(TOKENS_NAME, self._tokens_path, self.dtype, self.tokens)
            return self._token_map[start:stop]
        return self._read_range(self._tokens_path, self.dtype, start, stop)

    def offsets_range(self, start: int, stop: int) -> np.ndarray:
        if self._local:
            if self._offset_map is None:
                self._offset_map = self._map(OFFSETS_NAME, self._offsets_path, _OFFSET_DTYPE, self.documents + 1)
            return self._offset_map[start:stop]
        return self._read_range(self._offsets_path, _OFFSET_DTYPE, start, stop)

    def loss_mask_range(self, start: int, stop: int) -> np.ndarray:
        if self._local:
            if self._loss_mask_map is None:
                self._loss_mask_map = self._map(LOSS_MASK_NAME, self._loss_mask_path, _LOSS_MASK_DTYPE, self.tokens)
            return self._loss_mask_map[start:stop]
        return self._read_range(self._loss_mask_path, _LOSS_MASK_DTYPE, start, stop)


class TokenCache:
    """A finished token cache, read lazily. Open with :meth:`TokenCache.open`."""

    def __init__(self, url: str, ledger: dict[str, Any]):
        self.url = str(url).rstrip("/")
        self.ledger = ledger
        self.dtype = np.dtype(ledger["dtype"]).newbyteorder("<")
        self.has_loss_mask = ledger["format"] == FORMAT_WITH_LOSS_MASK
        self._shards = [_Shard(self.url, record, self.dtype, self.has_loss_mask) for record in ledger["shards"]]
        # Global start of each shard, in tokens and in documents, for O(log shards) lookup.
        self._token_starts = [0]
        self._doc_starts = [0]
        for shard in self._shards:
            self._token_starts.append(self._token_starts[-1] + shard.tokens)
            self._doc_starts.append(self._doc_starts[-1] + shard.documents)
        if self._token_starts[-1] != ledger["tokens"] or self._doc_starts[-1] != ledger["documents"]:
            raise CorruptTokenCacheError(
                f"ledger of {self.url} has totals that disagree with its shards; {_remedy(self.url)}"
            )
        self._boundaries: np.ndarray | None = None

    @classmethod
    def open(cls, url: str, *, verify_checksums: bool = True) -> TokenCache:
        """Open a finished cache, checking its ledger, file sizes and (unless told not to) checksums.

        ``verify_checksums=False`` skips reading every byte (see the module docstring for the cost);
        sizes are checked either way.
        """
        url = str(url).rstrip("/")
        cache = cls(url, _read_ledger(url))
        cache.verify(checksums=verify_checksums)
        return cache

    def verify(self, *, checksums: bool = True) -> None:
        """Raise :class:`CorruptTokenCacheError` naming the first file that disagrees with the ledger."""
        progress = _VerifyProgress(self.url, sum(shard.nbytes for shard in self._shards) if checksums else 0)
        workers = max(1, min(_VERIFY_THREADS, len(self._shards)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="token-cache-verify") as pool:
            futures = [pool.submit(shard.verify, checksums, progress) for shard in self._shards]
            try:
                for future in futures:  # in shard order, so the error names the first bad shard
                    future.result()
            finally:
                for future in futures:
                    future.cancel()
        if checksums:
            seconds = time.perf_counter() - progress.started
            logger.info(
                "verified token cache %s: %d shards, %.3f GB in %.2fs (%.2f GB/s)",
                self.url, len(self._shards), progress.done / 1e9, seconds, progress.done / 1e9 / max(seconds, 1e-9),
            )

    def check_token_ids(self, vocab_size: int, model: str = "the model") -> None:
        """Refuse a cache holding an id outside ``[0, vocab_size)``, e.g. a model's vocabulary.

        Reads the largest id of each shard: the one its writer recorded, or, once :meth:`verify`
        has hashed the tokens, the one found in them (ids are stored unsigned, so none is negative);
        an id beyond the embedding table would otherwise surface as NaN losses. ``model`` names the
        model in the error.
        """
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        for shard in self._shards:
            if shard.max_token_id is not None and shard.max_token_id >= vocab_size:
                raise self.token_id_error(shard.max_token_id, f"shard {shard.url}", vocab_size, model)

    def token_id_error(self, token_id: int, where: str, vocab_size: int, model: str = "the model") -> TokenIdOutOfRangeError:
        """The error for ``token_id`` found at ``where`` in this cache, beyond ``model``'s ``vocab_size``:
        it names the tokenizer the cache records and the model, the two that disagree."""
        tokenizer = self.metadata.get("tokenizer") or "a tokenizer the ledger does not name"
        return TokenIdOutOfRangeError(
            f"token cache {self.url}: {where} holds token id {token_id}, but {model} has vocab_size={vocab_size} "
            f"(ids 0..{vocab_size - 1}). The cache records tokenizer {tokenizer} with a vocabulary of "
            f"{self.vocab_size}: the tokenizer that wrote these ids and the model disagree. Train with a model "
            f"whose vocab_size is at least {max(token_id, self.max_token_id or 0) + 1}, or re-tokenize with the "
            "model's own tokenizer."
        )

    @property
    def num_documents(self) -> int:
        return self._doc_starts[-1]

    @property
    def num_tokens(self) -> int:
        return self._token_starts[-1]

    @property
    def vocab_size(self) -> int:
        return int(self.ledger["vocab_size"])

    @property
    def max_token_id(self) -> int | None:
        """The largest token id in the cache (None when it holds no tokens)."""
        largest = [shard.max_token_id for shard in self._shards if shard.max_token_id is not None]
        return max(largest) if largest else None

    @property
    def metadata(self) -> dict[str, Any]:
        return self.ledger["metadata"]

    def __len__(self) -> int:
        return self.num_documents

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the flat stream over all shards, as a fresh array."""
        return self._read_flat(start, stop, _Shard.tokens_range)

    def read_loss_mask(self, start: int, stop: int) -> np.ndarray:
        """The uint8 loss mask of tokens ``[start, stop)``: 1 where a token is trained on; all ones
        for a cache without masks."""
        if not self.has_loss_mask:
            self._check_range(start, stop)
            return np.ones(stop - start, dtype=_LOSS_MASK_DTYPE)
        return self._read_flat(start, stop, _Shard.loss_mask_range)

    def _check_range(self, start: int, stop: int) -> None:
        if start < 0 or stop > self.num_tokens or start > stop:
            raise IndexError(f"token range [{start}, {stop}) outside [0, {self.num_tokens}) of {self.url}")

    def _read_flat(self, start: int, stop: int, read: Any) -> np.ndarray:
        """``read(shard, local_start, local_stop)`` over the shards that hold flat range ``[start, stop)``."""
        self._check_range(start, stop)
        starts = self._token_starts
        index = bisect.bisect_right(starts, start) - 1
        base = starts[index]
        if stop <= starts[index + 1]:
            return np.array(read(self._shards[index], start - base, stop - base))
        pieces = []
        position = start
        while position < stop:
            base, end = starts[index], starts[index + 1]
            take = min(stop, end)
            if take > position:
                pieces.append(read(self._shards[index], position - base, take - base))
            position = take
            index += 1
        return np.concatenate(pieces)

    def document(self, index: int) -> np.ndarray:
        """The token ids of document ``index`` (counting across shards)."""
        if index < 0:
            index += self.num_documents
        if not 0 <= index < self.num_documents:
            raise IndexError(f"document {index} outside [0, {self.num_documents}) of {self.url}")
        shard_index = bisect.bisect_right(self._doc_starts, index) - 1
        shard = self._shards[shard_index]
        local = index - self._doc_starts[shard_index]
        begin, end = (int(x) for x in shard.offsets_range(local, local + 2))
        return np.array(shard.tokens_range(begin, end))

    def document_loss_mask(self, index: int) -> np.ndarray:
        """The uint8 loss mask of document ``index`` (all ones for a cache without masks)."""
        boundaries = self.document_boundaries()
        if index < 0:
            index += self.num_documents
        if not 0 <= index < self.num_documents:
            raise IndexError(f"document {index} outside [0, {self.num_documents}) of {self.url}")
        return self.read_loss_mask(int(boundaries[index]), int(boundaries[index + 1]))

    def document_boundaries(self) -> np.ndarray:
        """Global int64 offsets, ``num_documents + 1`` entries: document i is tokens [b[i], b[i+1])."""
        if self._boundaries is None:
            parts = [np.zeros(1, dtype=np.int64)]
            for shard, base in zip(self._shards, self._token_starts):
                if shard.documents:
                    parts.append(np.asarray(shard.offsets_range(1, shard.documents + 1), dtype=np.int64) + base)
            self._boundaries = np.concatenate(parts)
        return self._boundaries


__all__ = [
    "CHECKSUM_ALGORITHM",
    "FORMAT",
    "FORMAT_WITH_LOSS_MASK",
    "LOSS_MASK_NAME",
    "CorruptTokenCacheError",
    "IncompleteTokenCacheError",
    "OutdatedTokenCacheError",
    "ShardSummary",
    "TokenCache",
    "TokenCacheError",
    "TokenCacheShardWriter",
    "TokenIdOutOfRangeError",
    "dtype_for_vocab",
    "finalize_token_cache",
    "is_token_cache_complete",
    "read_shard_summary",
    "shard_name",
    "write_token_cache_shard",
]
