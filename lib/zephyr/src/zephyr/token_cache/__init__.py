"""The token cache: tokenized documents stored as flat token arrays plus document offsets.

One module per job: :mod:`~zephyr.token_cache.layout` (what a cache folder holds, and its
formats), :mod:`~zephyr.token_cache.writer` (streaming a shard to disk, hashed as it goes),
:mod:`~zephyr.token_cache.ledger` (the record written last that makes a cache finished),
:mod:`~zephyr.token_cache.verify` (sizes and checksums, and what checking them costs) and
:mod:`~zephyr.token_cache.reader` (:class:`TokenCache`: documents and token ranges, read lazily
from any store). The names below are the public ones; import them from here.
"""

from zephyr.token_cache.errors import (
    CorruptTokenCacheError,
    IncompleteTokenCacheError,
    OutdatedTokenCacheError,
    TokenCacheError,
    TokenIdOutOfRangeError,
)
from zephyr.token_cache.layout import (
    CHECKSUM_ALGORITHM,
    FORMAT,
    FORMAT_WITH_LOSS_MASK,
    LOSS_MASK_NAME,
    ShardSummary,
    dtype_for_vocab,
    read_shard_summary,
    shard_name,
)
from zephyr.token_cache.ledger import finalize_token_cache, is_token_cache_complete
from zephyr.token_cache.reader import TokenCache
from zephyr.token_cache.writer import TokenCacheShardWriter, write_token_cache_shard

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
