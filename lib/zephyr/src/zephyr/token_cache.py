"""The token cache: tokenized documents stored as flat token arrays plus document offsets.

Layout of a cache folder (a local path or any fsspec URL)::

    <cache>/ledger.json              written last, atomically, once every shard is finished
    <cache>/shard-00000/tokens.bin   little-endian token ids (uint16 if vocab_size <= 65536, else uint32)
    <cache>/shard-00000/offsets.bin  little-endian int64, documents + 1 entries: 0, end of doc 0, ...
    <cache>/shard-00000/shard.json   written last for the shard: {"documents", "tokens", "dtype"}

A shard without ``shard.json`` is incomplete and is never read or counted; a cache without
``ledger.json`` is incomplete and :meth:`TokenCache.open` refuses it. Because the arrays are raw
and fixed-width, any flat token range is found by index arithmetic and read without touching the
rest of the cache (a memory map locally, a byte-range request remotely).
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephyr._fs import (
    atomic_open,
    atomic_write_text,
    is_local,
    is_temporary_name,
    join_url,
    remove_if_exists,
    url_to_fs,
)

logger = logging.getLogger(__name__)

FORMAT = "marin-token-cache/1"
LEDGER_NAME = "ledger.json"
SHARD_SUMMARY_NAME = "shard.json"
TOKENS_NAME = "tokens.bin"
OFFSETS_NAME = "offsets.bin"
_OFFSET_DTYPE = np.dtype("<i8")
# Documents are buffered up to this many tokens before a write, so a shard of any size streams to
# disk with bounded memory.
_WRITE_CHUNK_TOKENS = 1 << 20


class TokenCacheError(Exception):
    """Base class for token-cache problems."""


class IncompleteTokenCacheError(TokenCacheError):
    """The cache (or a shard of it) was never finished: a writer crashed or is still running."""


class CorruptTokenCacheError(TokenCacheError):
    """The files of a finished cache disagree with its ledger."""


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
    """What a finished shard holds; the content of its ``shard.json``."""

    path: str
    documents: int
    tokens: int
    dtype: str


def read_shard_summary(shard_url: str) -> ShardSummary | None:
    """The summary of a finished shard, or None if the shard is missing or incomplete."""
    fs, path = url_to_fs(join_url(shard_url, SHARD_SUMMARY_NAME))
    try:
        with fs.open(path, "rb") as handle:
            data = json.loads(handle.read())
    except FileNotFoundError:
        return None
    return ShardSummary(path=shard_url, documents=int(data["documents"]), tokens=int(data["tokens"]), dtype=data["dtype"])


class TokenCacheShardWriter:
    """Streams documents into one shard; ``shard.json`` appears only after :meth:`finish`.

    Use as a context manager: leaving the block normally finishes the shard, leaving it with an
    exception discards the partial files (the shard stays absent/incomplete).
    """

    def __init__(self, url: str, dtype: Any):
        self.url = str(url).rstrip("/")
        self.dtype = _normalize_dtype(dtype)
        self._max_id = np.iinfo(self.dtype).max
        # A rewrite must never look finished while its files are being replaced.
        remove_if_exists(join_url(self.url, SHARD_SUMMARY_NAME))
        _remove_stale_temporaries(self.url)
        self._tokens_cm = atomic_open(join_url(self.url, TOKENS_NAME), "wb")
        self._offsets_cm = atomic_open(join_url(self.url, OFFSETS_NAME), "wb")
        self._tokens_file = self._tokens_cm.__enter__()
        self._offsets_file = self._offsets_cm.__enter__()
        self._pending_tokens: list[np.ndarray] = []
        self._pending_ends: list[int] = []
        self._pending_count = 0
        self._documents = 0
        self._tokens = 0
        self._closed = False
        self._offsets_file.write(np.zeros(1, dtype=_OFFSET_DTYPE).tobytes())

    def write(self, document: Sequence[int] | np.ndarray) -> None:
        """Append one document's token ids."""
        ids = np.asarray(document)
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
        self._tokens += int(ids.size)
        self._documents += 1
        self._pending_ends.append(self._tokens)
        self._pending_count += int(ids.size)
        if self._pending_count >= _WRITE_CHUNK_TOKENS or len(self._pending_ends) >= 65536:
            self._flush()

    def write_many(self, documents: Iterable[Sequence[int] | np.ndarray]) -> None:
        for document in documents:
            self.write(document)

    def _flush(self) -> None:
        if self._pending_tokens:
            self._tokens_file.write(np.concatenate(self._pending_tokens).tobytes())
        if self._pending_ends:
            self._offsets_file.write(np.asarray(self._pending_ends, dtype=_OFFSET_DTYPE).tobytes())
        self._pending_tokens, self._pending_ends, self._pending_count = [], [], 0

    def finish(self) -> ShardSummary:
        """Close the arrays, then write ``shard.json``: from here on the shard counts."""
        if self._closed:
            raise RuntimeError("shard writer already closed")
        self._flush()
        self._closed = True
        self._tokens_cm.__exit__(None, None, None)
        self._offsets_cm.__exit__(None, None, None)
        summary = ShardSummary(self.url, self._documents, self._tokens, _dtype_name(self.dtype))
        atomic_write_text(
            join_url(self.url, SHARD_SUMMARY_NAME),
            json.dumps({"documents": summary.documents, "tokens": summary.tokens, "dtype": summary.dtype}),
        )
        return summary

    def abort(self) -> None:
        """Discard everything written so far."""
        if self._closed:
            return
        self._closed = True
        error = RuntimeError("token cache shard write aborted")
        for cm in (self._tokens_cm, self._offsets_cm):
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


def write_token_cache_shard(url: str, documents: Iterable[Sequence[int] | np.ndarray], dtype: Any) -> ShardSummary:
    """Write one shard from an iterable of documents (each a sequence of token ids)."""
    with TokenCacheShardWriter(url, dtype) as writer:
        writer.write_many(documents)
        return writer.finish()


def finalize_token_cache(
    cache_url: str,
    shard_paths: Sequence[str],
    *,
    vocab_size: int,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Check every listed shard is finished and write ``ledger.json`` (last, atomically).

    ``shard_paths`` are shard folders relative to ``cache_url`` (``"shard-00000"``) or full URLs
    under it; their order is the cache's document order.
    """
    cache_url = str(cache_url).rstrip("/")
    expected = _dtype_name(dtype_for_vocab(vocab_size))
    shards = []
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
        shards.append({"path": relative, "documents": summary.documents, "tokens": summary.tokens})
    ledger = {
        "format": FORMAT,
        "dtype": expected,
        "vocab_size": int(vocab_size),
        "documents": sum(s["documents"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        "metadata": dict(metadata or {}),
    }
    atomic_write_text(join_url(cache_url, LEDGER_NAME), json.dumps(ledger, indent=2, sort_keys=True))
    return ledger


def _relative_shard_path(cache_url: str, shard_path: str) -> str:
    if shard_path.startswith(cache_url + "/"):
        return shard_path[len(cache_url) + 1 :].strip("/")
    if "://" in shard_path or shard_path.startswith("/"):
        raise ValueError(f"shard {shard_path!r} is not inside token cache {cache_url}")
    return shard_path.strip("/")


def is_token_cache_complete(url: str) -> bool:
    fs, path = url_to_fs(join_url(url, LEDGER_NAME))
    return fs.exists(path)


class _Shard:
    """Read access to one shard's two arrays; memory-mapped locally, byte ranges remotely."""

    def __init__(self, url: str, documents: int, tokens: int, dtype: np.dtype):
        self.url = url
        self.documents = documents
        self.tokens = tokens
        self.dtype = dtype
        self._fs, self._tokens_path = url_to_fs(join_url(url, TOKENS_NAME))
        self._offsets_path = url_to_fs(join_url(url, OFFSETS_NAME))[1]
        self._local = is_local(self._fs)
        self._token_map: np.ndarray | None = None
        self._offset_map: np.ndarray | None = None

    def _map(self, path: str, dtype: np.dtype, count: int) -> np.ndarray:
        expected = count * dtype.itemsize
        try:
            actual = self._fs.size(path)
        except FileNotFoundError:
            raise CorruptTokenCacheError(f"{path} is missing although the ledger lists its shard") from None
        if actual != expected:
            raise CorruptTokenCacheError(f"{path} holds {actual} bytes; the ledger implies {expected}")
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
                self._token_map = self._map(self._tokens_path, self.dtype, self.tokens)
            return self._token_map[start:stop]
        return self._read_range(self._tokens_path, self.dtype, start, stop)

    def offsets_range(self, start: int, stop: int) -> np.ndarray:
        if self._local:
            if self._offset_map is None:
                self._offset_map = self._map(self._offsets_path, _OFFSET_DTYPE, self.documents + 1)
            return self._offset_map[start:stop]
        return self._read_range(self._offsets_path, _OFFSET_DTYPE, start, stop)


class TokenCache:
    """A finished token cache, read lazily. Open with :meth:`TokenCache.open`."""

    def __init__(self, url: str, ledger: dict[str, Any]):
        self.url = str(url).rstrip("/")
        self.ledger = ledger
        self.dtype = np.dtype(ledger["dtype"]).newbyteorder("<")
        self._shards = [
            _Shard(join_url(self.url, s["path"]), int(s["documents"]), int(s["tokens"]), self.dtype)
            for s in ledger["shards"]
        ]
        # Global start of each shard, in tokens and in documents, for O(log shards) lookup.
        self._token_starts = [0]
        self._doc_starts = [0]
        for shard in self._shards:
            self._token_starts.append(self._token_starts[-1] + shard.tokens)
            self._doc_starts.append(self._doc_starts[-1] + shard.documents)
        if self._token_starts[-1] != ledger["tokens"] or self._doc_starts[-1] != ledger["documents"]:
            raise CorruptTokenCacheError(f"ledger of {self.url} has totals that disagree with its shards")
        self._boundaries: np.ndarray | None = None

    @classmethod
    def open(cls, url: str) -> TokenCache:
        url = str(url).rstrip("/")
        fs, path = url_to_fs(join_url(url, LEDGER_NAME))
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
        if ledger.get("format") != FORMAT:
            raise TokenCacheError(f"{url}: unsupported token cache format {ledger.get('format')!r}, expected {FORMAT}")
        return cls(url, ledger)

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
    def metadata(self) -> dict[str, Any]:
        return self.ledger["metadata"]

    def __len__(self) -> int:
        return self.num_documents

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the flat stream over all shards, as a fresh array."""
        if start < 0 or stop > self.num_tokens or start > stop:
            raise IndexError(f"token range [{start}, {stop}) outside [0, {self.num_tokens}) of {self.url}")
        starts = self._token_starts
        index = bisect.bisect_right(starts, start) - 1
        base = starts[index]
        if stop <= starts[index + 1]:
            return np.array(self._shards[index].tokens_range(start - base, stop - base))
        pieces = []
        position = start
        while position < stop:
            base, end = starts[index], starts[index + 1]
            take = min(stop, end)
            if take > position:
                pieces.append(self._shards[index].tokens_range(position - base, take - base))
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
    "FORMAT",
    "CorruptTokenCacheError",
    "IncompleteTokenCacheError",
    "ShardSummary",
    "TokenCache",
    "TokenCacheError",
    "TokenCacheShardWriter",
    "dtype_for_vocab",
    "finalize_token_cache",
    "is_token_cache_complete",
    "read_shard_summary",
    "shard_name",
    "write_token_cache_shard",
]
