"""What a token cache folder holds: file names, formats, dtypes and the per-shard summary.

Layout of a cache folder (a local path or any fsspec URL)::

    <cache>/ledger.json              written last, atomically, once every shard is finished
    <cache>/shard-00000/tokens.bin   little-endian token ids (uint16 if vocab_size <= 65536, else uint32)
    <cache>/shard-00000/offsets.bin  little-endian int64, documents + 1 entries: 0, end of doc 0, ...
    <cache>/shard-00000/loss_mask.bin  optional: one uint8 per token, 1 where the token is trained on
    <cache>/shard-00000/shard.json   written last for the shard: counts, dtype, max token id, checksums

A shard without ``shard.json`` is incomplete and is never read or counted; a cache without
``ledger.json`` is incomplete and is never opened. Because the arrays are raw and fixed-width, any
flat token range is found by index arithmetic and read without touching the rest of the cache.

Loss masks. A cache may carry a per-token loss mask beside its tokens (``loss_mask.bin``, one
byte per token: 1 where predicting that token is trained on, 0 where the token is context only,
such as the user's turns of a conversation). Every shard of such a cache has one, covered by the
shard's checksums and size checks like the other arrays, and the ledger says format
``marin-token-cache/3``, so a reader that does not know masks refuses the cache instead of
silently training on every token. A cache without masks is still written as format
``marin-token-cache/2``, byte for byte as before, and reads as all ones.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from zephyr._fs import join_url, url_to_fs
from zephyr.token_cache.errors import CorruptTokenCacheError

logger = logging.getLogger(__name__)

FORMAT = "marin-token-cache/2"
# Format 2 plus a per-token loss mask in every shard; only caches that carry masks are written so.
FORMAT_WITH_LOSS_MASK = "marin-token-cache/3"
LEDGER_NAME = "ledger.json"
SHARD_SUMMARY_NAME = "shard.json"
TOKENS_NAME = "tokens.bin"
OFFSETS_NAME = "offsets.bin"
LOSS_MASK_NAME = "loss_mask.bin"
OFFSET_DTYPE = np.dtype("<i8")
LOSS_MASK_DTYPE = np.dtype("u1")
# Every checksum in a cache, written or verified, is this hash (zephyr.token_cache.verify says why).
CHECKSUM_ALGORITHM = "xxh3_64"
new_hasher = xxhash.xxh3_64


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The narrowest token dtype that holds every id below ``vocab_size``."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def dtype_name(dtype: np.dtype) -> str:
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
