"""Writing a token cache shard: documents stream into flat arrays, hashed on their way to disk."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from rigging.filesystem import atomic_open

from zephyr._fs import atomic_write_text, is_temporary_name, join_url, remove_if_exists, url_to_fs
from zephyr.token_cache.layout import (
    CHECKSUM_ALGORITHM,
    LOSS_MASK_DTYPE,
    LOSS_MASK_NAME,
    OFFSET_DTYPE,
    OFFSETS_NAME,
    SHARD_SUMMARY_NAME,
    TOKENS_NAME,
    ShardSummary,
    dtype_name,
    new_hasher,
)

# Documents are buffered up to this many tokens before a write, so a shard of any size streams to
# disk with bounded memory.
_WRITE_CHUNK_TOKENS = 1 << 20


def _normalize_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind != "u" or dt.itemsize not in (2, 4):
        raise ValueError(f"token dtype must be uint16 or uint32, got {dt}")
    return dt.newbyteorder("<")


class TokenCacheShardWriter:
    """Streams documents into one shard; ``shard.json`` appears only after :meth:`finish`.

    Use as a context manager: leaving the block normally finishes the shard, leaving it with an
    exception discards the partial files (the shard stays absent/incomplete).

    With ``loss_mask=True`` every document comes with its per-token loss mask (see
    :mod:`zephyr.token_cache.layout`), written to ``loss_mask.bin`` beside the tokens.
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
        self._hashers = {name: new_hasher() for name in names}
        self._largest_id = -1
        self._pending_tokens: list[np.ndarray] = []
        self._pending_masks: list[np.ndarray] = []
        self._pending_ends: list[int] = []
        self._pending_count = 0
        self._documents = 0
        self._tokens = 0
        self._closed = False
        self._write_bytes(OFFSETS_NAME, np.zeros(1, dtype=OFFSET_DTYPE).tobytes())

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
        return mask.astype(LOSS_MASK_DTYPE, copy=False)

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
            ends = np.asarray(self._pending_ends, dtype=OFFSET_DTYPE)
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
            dtype_name(self.dtype),
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
