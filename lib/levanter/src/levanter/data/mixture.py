"""Which dataset each training sequence comes from, for a weighted mixture, computed without replay.

Sequences are grouped in blocks of ``block_size``. Each block holds every dataset an exact number of
times (its weight times the block size, rounded by largest remainder) in an order shuffled by a
permutation seeded with ``(seed, block)``. So the dataset of global sequence ``g`` and how many
sequences that dataset gave before ``g`` are both computed from ``g`` alone: a restart at any step
resumes the same stream, and the realised ratio never drifts more than one sequence per block from
the weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from levanter.data.permutation import FeistelPermutation

DEFAULT_BLOCK_SIZE = 2048
_MIXTURE_STREAM = 0x4D4958  # separates mixture seeds from the shuffle seeds of the datasets


def block_counts(weights: Sequence[float], block_size: int) -> np.ndarray:
    """Sequences per dataset in one block: proportional to ``weights``, summing to ``block_size``."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError("a mixture needs at least one dataset weight")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"mixture weights must be finite, non-negative and not all zero, got {list(weights)}")
    exact = w / w.sum() * block_size
    counts = np.floor(exact).astype(np.int64)
    # Largest remainder; ties go to the earlier dataset so the result is deterministic.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: block_size - counts.sum()]] += 1
    return counts


class MixtureSchedule:
    """Maps a global sequence index to ``(dataset index, index within that dataset's stream)``."""

    def __init__(self, weights: Sequence[float], seed: int, block_size: int = DEFAULT_BLOCK_SIZE):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.counts = block_counts(weights, block_size)
        self.block_size = block_size
        self.seed = int(seed)
        self._slot_ends = np.cumsum(self.counts)
        self._block = lru_cache(maxsize=4)(self._compute_block)

    @property
    def num_datasets(self) -> int:
        return len(self.counts)

    def _compute_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.counts) == 1:
            return np.zeros(self.block_size, dtype=np.int64), np.arange(self.block_size, dtype=np.int64)
        slots = FeistelPermutation(self.block_size, (self.seed, _MIXTURE_STREAM, block))(np.arange(self.block_size))
        dataset = np.searchsorted(self._slot_ends, slots, side="right")
        rank = np.empty(self.block_size, dtype=np.int64)
        for d in range(len(self.counts)):
            where = np.flatnonzero(dataset == d)
            rank[where] = np.arange(where.size)
        return dataset, rank

    def lookup(self, index: int) -> tuple[int, int]:
        """The dataset of global sequence ``index`` and its position in that dataset's stream."""
        if index < 0:
            raise IndexError(f"sequence index must be >= 0, got {index}")
        block, offset = divmod(int(index), self.block_size)
        dataset, rank = self._block(block)
        d = int(dataset[offset])
        return d, block * int(self.counts[d]) + int(rank[offset])
