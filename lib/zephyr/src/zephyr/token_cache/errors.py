"""The token cache's errors: one class for each way a cache can be unusable, all under TokenCacheError."""

from __future__ import annotations

from zephyr.errors import ZephyrError


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


def remedy(cache_url: str) -> str:
    return (
        f"delete the cache folder {cache_url} and rerun the step that wrote it (for a tokenize step, delete "
        "that step's whole output folder, so the runner does not skip it as already done)"
    )
