"""Fixed-length token windows over a token cache, and the train/validation split of those windows.

Window ``i`` of a cache is tokens ``[i * seq_len, (i + 1) * seq_len)`` of its flat token stream:
windows never overlap and ignore document boundaries (documents are packed, separated by the EOS the
tokenizer appended). ``segment_ids`` number the documents inside each window from 0 so that models
can mask attention per document. A trailing partial window is dropped.

The loss mask of a window follows ``Batch``'s convention: position ``t`` predicts token ``t + 1``,
so it is weighted by the cache's mask of that *target* token (for a conversation: 1 where the next
token is the assistant's). A cache without masks trains on every prediction; the last position of
a window, whose target lies outside it, never counts.

Given the model's ``vocab_size``, every window read is checked against it (a max over ``seq_len``
ids): opening a cache checks its largest id when its checksums are verified, but a cache opened
without verification has only its ledger's word, and an id past the embedding table trains to NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephyr.token_cache import TokenCache

from levanter.errors import LevanterError


class NotEnoughTokensError(LevanterError, ValueError):
    """A cache is too small to give even one window (or one train and one validation window)."""


@dataclass(frozen=True, eq=False)
class TokenWindows:
    """Windows ``[first, first + count)`` of a cache, addressed ``0 .. count - 1``."""

    cache: TokenCache
    seq_len: int
    first: int
    count: int
    vocab_size: int | None = None  # the model's: ids at or past it are refused as they are read

    @classmethod
    def over(cls, cache: TokenCache | str, seq_len: int, vocab_size: int | None = None) -> "TokenWindows":
        """All full windows of ``cache`` (a :class:`TokenCache` or its URL)."""
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (a window predicts its own next tokens), got {seq_len}")
        if isinstance(cache, str):
            cache = TokenCache.open(cache)
        count = cache.num_tokens // seq_len
        if count == 0:
            raise NotEnoughTokensError(
                f"token cache {cache.url} holds {cache.num_tokens} tokens, fewer than one window of "
                f"seq_len={seq_len}; use a shorter seq_len or more data"
            )
        return cls(cache=cache, seq_len=seq_len, first=0, count=count, vocab_size=vocab_size)

    def __len__(self) -> int:
        return self.count

    @property
    def name(self) -> str:
        return self.cache.url

    def slice(self, start: int, stop: int) -> "TokenWindows":
        if not 0 <= start <= stop <= self.count:
            raise IndexError(f"window slice [{start}, {stop}) outside [0, {self.count})")
        return TokenWindows(cache=self.cache, seq_len=self.seq_len, first=self.first + start, count=stop - start,
                            vocab_size=self.vocab_size)

    def tokens_and_segments(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``index``: its int32 tokens and int32 segment ids."""
        if not 0 <= index < self.count:
            raise IndexError(f"window {index} outside [0, {self.count}) of {self.name}")
        start = (self.first + index) * self.seq_len
        stop = start + self.seq_len
        tokens = self.cache.read_tokens(start, stop).astype(np.int32)
        if self.vocab_size is not None and tokens.size and (largest := int(tokens.max())) >= self.vocab_size:
            raise self.cache.token_id_error(largest, f"window {index} (tokens {start}..{stop - 1})", self.vocab_size)
        boundaries = self._boundaries()
        # Document starts strictly inside the window each open a new segment.
        lo = np.searchsorted(boundaries, start, side="right")
        hi = np.searchsorted(boundaries, stop, side="left")
        markers = np.zeros(self.seq_len, dtype=np.int32)
        markers[boundaries[lo:hi] - start] = 1
        return tokens, np.cumsum(markers, dtype=np.int32)

    def loss_mask(self, index: int) -> np.ndarray:
        """Window ``index``'s float32 loss mask: ``mask[t]`` weights the prediction of token ``t + 1``."""
        if not 0 <= index < self.count:
            raise IndexError(f"window {index} outside [0, {self.count}) of {self.name}")
        start = (self.first + index) * self.seq_len
        mask = np.zeros(self.seq_len, dtype=np.float32)
        mask[:-1] = self.cache.read_loss_mask(start + 1, start + self.seq_len)
        return mask

    def _boundaries(self) -> np.ndarray:
        return self.cache.document_boundaries()


def split_heldout(windows: TokenWindows, fraction: float) -> tuple[TokenWindows, TokenWindows]:
    """Split into (train, validation): validation is the last ``fraction`` of the windows (at least one).

    Windows do not overlap, so no validation token is ever trained on. The tail is chosen, not a
    random subset, so the split is the same for every seed and every run.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"held-out validation fraction must be in (0, 1), got {fraction}")
    if windows.count < 2:
        raise NotEnoughTokensError(
            f"{windows.name} gives {windows.count} window(s) of seq_len={windows.seq_len}: too few to hold "
            "out a validation slice; provide a validation split or more data"
        )
    held = min(windows.count - 1, max(1, round(windows.count * fraction)))
    return windows.slice(0, windows.count - held), windows.slice(windows.count - held, windows.count)
