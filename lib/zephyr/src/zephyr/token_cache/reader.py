"""Reading a finished token cache: documents and flat token ranges, fetched lazily from any store.

Any flat token range is found by index arithmetic over the shards' counts and read without
touching the rest of the cache: a memory map locally, a byte-range request remotely.
:meth:`TokenCache.open` reads the ledger and verifies the files before anything is read.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

import numpy as np

from zephyr._fs import is_local, join_url, url_to_fs
from zephyr.token_cache.errors import CorruptTokenCacheError, TokenIdOutOfRangeError, remedy
from zephyr.token_cache.layout import (
    FORMAT_WITH_LOSS_MASK,
    LOSS_MASK_DTYPE,
    LOSS_MASK_NAME,
    OFFSET_DTYPE,
    OFFSETS_NAME,
    TOKENS_NAME,
)
from zephyr.token_cache.ledger import read_ledger
from zephyr.token_cache.verify import check_size, verify_shards


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
        self.fs, self._tokens_path = url_to_fs(join_url(self.url, TOKENS_NAME))
        self._offsets_path = url_to_fs(join_url(self.url, OFFSETS_NAME))[1]
        self.has_loss_mask = has_loss_mask
        self._loss_mask_path = url_to_fs(join_url(self.url, LOSS_MASK_NAME))[1]
        self._local = is_local(self.fs)
        self._token_map: np.ndarray | None = None
        self._offset_map: np.ndarray | None = None
        self._loss_mask_map: np.ndarray | None = None

    def files(self) -> list[tuple[str, str, int]]:
        """(name, path, size the ledger implies) of each array."""
        files = [
            (TOKENS_NAME, self._tokens_path, self.tokens * self.dtype.itemsize),
            (OFFSETS_NAME, self._offsets_path, (self.documents + 1) * OFFSET_DTYPE.itemsize),
        ]
        if self.has_loss_mask:
            files.append((LOSS_MASK_NAME, self._loss_mask_path, self.tokens * LOSS_MASK_DTYPE.itemsize))
        return files

    @property
    def nbytes(self) -> int:
        return sum(size for _, _, size in self.files())

    def _map(self, name: str, path: str, dtype: np.dtype, count: int) -> np.ndarray:
        # Checked again here, not only at open: a file replaced since then must not be misread.
        check_size(self, name, path, count * dtype.itemsize)
        if count == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))

    def _read_range(self, path: str, dtype: np.dtype, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros(0, dtype=dtype)
        data = self.fs.cat_file(path, start=start * dtype.itemsize, end=stop * dtype.itemsize)
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
                self._offset_map = self._map(OFFSETS_NAME, self._offsets_path, OFFSET_DTYPE, self.documents + 1)
            return self._offset_map[start:stop]
        return self._read_range(self._offsets_path, OFFSET_DTYPE, start, stop)

    def loss_mask_range(self, start: int, stop: int) -> np.ndarray:
        if self._local:
            if self._loss_mask_map is None:
                self._loss_mask_map = self._map(LOSS_MASK_NAME, self._loss_mask_path, LOSS_MASK_DTYPE, self.tokens)
            return self._loss_mask_map[start:stop]
        return self._read_range(self._loss_mask_path, LOSS_MASK_DTYPE, start, stop)


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
                f"ledger of {self.url} has totals that disagree with its shards; {remedy(self.url)}"
            )
        self._boundaries: np.ndarray | None = None

    @classmethod
    def open(cls, url: str, *, verify_checksums: bool = True) -> TokenCache:
        """Open a finished cache, checking its ledger, file sizes and (unless told not to) checksums.

        ``verify_checksums=False`` skips reading every byte (see :mod:`zephyr.token_cache.verify` for
        the cost); sizes are checked either way.
        """
        url = str(url).rstrip("/")
        cache = cls(url, read_ledger(url))
        cache.verify(checksums=verify_checksums)
        return cache

    def verify(self, *, checksums: bool = True) -> None:
        """Raise :class:`CorruptTokenCacheError` naming the first file that disagrees with the ledger."""
        verify_shards(self.url, self._shards, checksums=checksums)

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
            return np.ones(stop - start, dtype=LOSS_MASK_DTYPE)
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
