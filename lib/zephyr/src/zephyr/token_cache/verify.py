"""Verifying a token cache: every file's size, and its bytes against the checksums its writer recorded.

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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from zephyr._fs import join_url
from zephyr.token_cache.errors import CorruptTokenCacheError, remedy
from zephyr.token_cache.layout import CHECKSUM_ALGORITHM, TOKENS_NAME, new_hasher

logger = logging.getLogger(__name__)

# Verification reads each file in chunks of this size (bounded memory for any shard size), and
# several shards at once: remote stores give more throughput to parallel streams.
_VERIFY_CHUNK_BYTES = 8 << 20
_VERIFY_THREADS = 8
_PROGRESS_EVERY_SECONDS = 10.0


class VerifiedShard(Protocol):
    """What verification needs of a shard: where its files are, their sizes and recorded digests."""

    url: str
    cache_url: str
    dtype: np.dtype
    checksums: dict[str, str]
    max_token_id: int | None

    @property
    def fs(self) -> Any: ...

    @property
    def nbytes(self) -> int: ...

    def files(self) -> list[tuple[str, str, int]]: ...


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
    hasher = new_hasher()
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


def check_size(shard: VerifiedShard, name: str, path: str, expected: int) -> None:
    """Raise :class:`CorruptTokenCacheError` unless the shard's file ``name`` holds ``expected`` bytes."""
    url = join_url(shard.url, name)
    try:
        actual = shard.fs.size(path)
    except FileNotFoundError:
        raise CorruptTokenCacheError(
            f"{url} is missing although the ledger lists its shard; {remedy(shard.cache_url)}"
        ) from None
    if actual != expected:
        raise CorruptTokenCacheError(
            f"{url} holds {actual} bytes; the ledger implies {expected} (a truncated or partial copy?); "
            f"{remedy(shard.cache_url)}"
        )


def _verify_shard(shard: VerifiedShard, checksums: bool, progress: _VerifyProgress) -> None:
    """Sizes always; with ``checksums`` also every byte, against the digests the writer recorded."""
    for name, path, expected in shard.files():
        check_size(shard, name, path, expected)
    if not checksums:
        return
    for name, path, _ in shard.files():
        actual, largest = _file_checksum(shard.fs, path, progress, shard.dtype if name == TOKENS_NAME else None)
        if actual != shard.checksums[name]:
            raise CorruptTokenCacheError(
                f"{join_url(shard.url, name)} does not match its checksum in the ledger (recorded "
                f"{shard.checksums[name]}, found {actual}): the file changed after it was written (disk or "
                f"copy corruption, or an edit); {remedy(shard.cache_url)}"
            )
        if name == TOKENS_NAME and largest != shard.max_token_id:
            # A checksum recomputed after the tokens were replaced matches, but the recorded largest
            # id is then stale: the bytes were just read, so their own largest id is what counts.
            logger.warning(
                "%s records largest token id %s but its tokens hold %s; using the tokens' own.",
                shard.url, shard.max_token_id, largest,
            )
            shard.max_token_id = largest


def verify_shards(cache_url: str, shards: Sequence[VerifiedShard], *, checksums: bool = True) -> None:
    """Raise :class:`CorruptTokenCacheError` naming the first file that disagrees with the ledger."""
    progress = _VerifyProgress(cache_url, sum(shard.nbytes for shard in shards) if checksums else 0)
    workers = max(1, min(_VERIFY_THREADS, len(shards)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="token-cache-verify") as pool:
        futures = [pool.submit(_verify_shard, shard, checksums, progress) for shard in shards]
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
            cache_url, len(shards), progress.done / 1e9, seconds, progress.done / 1e9 / max(seconds, 1e-9),
        )
