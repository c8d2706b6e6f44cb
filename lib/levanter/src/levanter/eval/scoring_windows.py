"""Windows over a token cache in which every token is scored exactly once.

The training loader's windows (``levanter.data.TokenWindows``) never score the first token of a
window and drop a trailing partial window; that is fine for a running validation loss but not for
bits per byte, whose denominator is the bytes of the text that was scored. Here window ``k`` covers
positions ``[k * (L - 1), k * (L - 1) + L)`` of the stream, so consecutive windows share one token:
the last target of a window is the first (context-only) position of the next. Each scored token
sees between 1 and ``L - 1`` tokens of context, as in training.

So that the very first token of the cache is scored too, the stream is prefixed with the cache's
EOS token: the token that precedes every other document, which the model has learnt to predict a
document start from. A cache without EOS but with BOS starts with that BOS (a special token with no
bytes), which is then the context. Only a cache with neither leaves its first token unscored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from levanter.data.batch import Batch
from zephyr.token_cache import TokenCache


@dataclass(frozen=True, eq=False)
class ScoringWindows:
    """Fixed-length windows that together score every token of ``cache`` once (see module docs).

    ``prefix_id``: a token put before the cache's stream as context for its first token (None: the
    first token is context only and is not scored).
    """

    cache: TokenCache
    seq_len: int
    prefix_id: int | None = None

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (a window predicts its own next tokens), got {self.seq_len}")
        if self.cache.num_tokens == 0:
            raise ValueError(f"token cache {self.cache.url} is empty: there is nothing to evaluate")

    @classmethod
    def over(cls, cache: TokenCache | str, seq_len: int) -> "ScoringWindows":
        """Windows over ``cache`` with the context token its metadata implies (EOS, if documents end with one)."""
        if isinstance(cache, str):
            cache = TokenCache.open(cache)
        return cls(cache=cache, seq_len=seq_len, prefix_id=cache.metadata.get("eos_id"))

    @property
    def stream_length(self) -> int:
        """Tokens in the stream windows are cut from: the cache's, plus the prefix token."""
        return self.cache.num_tokens + (self.prefix_id is not None)

    @property
    def scored_tokens(self) -> int:
        """Every stream position but the first is a target exactly once."""
        return self.stream_length - 1

    def __len__(self) -> int:
        stride = self.seq_len - 1
        return -(-self.scored_tokens // stride)

    def window(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Window ``index``: int32 tokens, float32 loss mask, int32 segment ids (zero-padded past the end)."""
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} outside [0, {len(self)}) of {self.cache.url}")
        shift = int(self.prefix_id is not None)
        start = index * (self.seq_len - 1)  # in stream coordinates
        stop = min(start + self.seq_len, self.stream_length)
        valid = stop - start
        tokens = np.zeros(self.seq_len, dtype=np.int32)
        offset = 0
        if start < shift:  # the first window: position 0 holds the prefix token
            tokens[0] = self.prefix_id
            offset = 1
        tokens[offset:valid] = self.cache.read_tokens(start + offset - shift, stop - shift)
        mask = np.zeros(self.seq_len, dtype=np.float32)
        mask[: valid - 1] = 1.0  # position t scores token t + 1; the last real token has no target here
        # Document starts strictly inside the window open a new segment, as in the training windows.
        starts = self.cache.document_boundaries()[:-1] + shift
        lo = np.searchsorted(starts, start, side="right")
        hi = np.searchsorted(starts, stop, side="left")
        markers = np.zeros(self.seq_len, dtype=np.int32)
        markers[starts[lo:hi] - start] = 1
        return tokens, mask, np.cumsum(markers, dtype=np.int32)

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Every window once, in order, ``batch_size`` rows at a time; the last batch is padded with
        rows whose loss mask is zero, so every batch has the same shape (one compilation)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for first in range(0, len(self), batch_size):
            tokens = np.zeros((batch_size, self.seq_len), dtype=np.int32)
            mask = np.zeros((batch_size, self.seq_len), dtype=np.float32)
            segments = np.zeros((batch_size, self.seq_len), dtype=np.int32)
            for row, index in enumerate(range(first, min(first + batch_size, len(self)))):
                tokens[row], mask[row], segments[row] = self.window(index)
            yield Batch(tokens=tokens, loss_mask=mask, segment_ids=segments)

    def num_batches(self, batch_size: int) -> int:
        return -(-len(self) // batch_size)
