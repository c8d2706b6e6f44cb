"""A small in-memory data source for tests, benchmarks and notebooks.

The real loader (``levanter.data``) reads token caches; this one cuts windows from a token array
already in memory. Both honour the trainer's contract: ``iter_from(k)`` yields exactly the batches
an uninterrupted run yields from step ``k`` on.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from levanter.data.batch import Batch


class InMemoryWindows:
    """Windows of ``seq_len`` tokens from a flat ``tokens`` array; batch ``k`` is drawn with an RNG
    seeded by ``(seed, k)``, so any step can be produced without replaying the ones before it."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, batch_size: int, seed: int = 0):
        self.tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if self.tokens.size < seq_len:
            raise ValueError(f"Need at least seq_len={seq_len} tokens, got {self.tokens.size}.")
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.num_windows = self.tokens.size // seq_len

    def batch_at(self, step: int) -> Batch:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.num_windows, size=self.batch_size) * self.seq_len
        rows = np.stack([self.tokens[s : s + self.seq_len] for s in starts])
        return Batch.from_tokens(rows)

    def iter_from(self, start_step: int) -> Iterator[Batch]:
        step = start_step
        while True:
            yield self.batch_at(step)
            step += 1

    def sequential_batches(self, limit: int | None = None) -> Iterator[Batch]:
        """Every window once, in order (for evaluation); the last partial batch is dropped."""
        count = self.num_windows // self.batch_size
        if limit is not None:
            count = min(count, limit)
        for i in range(count):
            base = i * self.batch_size * self.seq_len
            rows = self.tokens[base : base + self.batch_size * self.seq_len].reshape(self.batch_size, self.seq_len)
            yield Batch.from_tokens(rows)
