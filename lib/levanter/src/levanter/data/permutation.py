"""A seeded permutation of ``range(n)`` that maps any single index in O(1), with no table.

Shuffling a dataset by materialising ``rng.permutation(n)`` costs memory proportional to the data
and, worse, ties the order to a random generator's stream. A Feistel network is a bijection on
``2**bits`` values for any round function; restricted to ``[0, n)`` by cycle-walking (re-encrypt
until the value falls inside the range) it is a bijection on ``[0, n)``. So the element at any
position, at any step of training, is computed directly: restarting at step k needs no replay.
The round keys come from ``numpy.random.SeedSequence`` and the round function is plain 64-bit
integer arithmetic, so the order is the same on every machine and numpy version.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_ROUNDS = 6
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser: every input bit affects every output bit.
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    """A bijection on ``[0, n)`` determined by ``seed`` (an int or a sequence of ints)."""

    def __init__(self, n: int, seed: int | Sequence[int]):
        if n < 0:
            raise ValueError(f"permutation size must be >= 0, got {n}")
        self.n = int(n)
        entropy = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
        if any(s < 0 for s in entropy):
            raise ValueError(f"permutation seeds must be non-negative, got {entropy}")
        self._keys = np.random.SeedSequence(entropy).generate_state(_ROUNDS, dtype=np.uint64)
        bits = max(1, int(self.n - 1).bit_length()) if self.n > 1 else 0
        self._half = np.uint64((bits + 1) // 2)
        self._mask = np.uint64((1 << int(self._half)) - 1)

    def __len__(self) -> int:
        return self.n

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix64((right + np.uint64(1)) * _GOLDEN ^ key) & self._mask)
        return (left << self._half) | right

    def __call__(self, index: int | np.ndarray) -> np.ndarray:
        """The permuted position(s) of ``index`` (an int or an integer array), as int64."""
        idx = np.asarray(index, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"index outside [0, {self.n}) of the permutation")
        if self.n <= 1:
            return idx.copy()
        out = self._encrypt(idx.astype(np.uint64).reshape(-1))
        outside = out >= np.uint64(self.n)
        # Cycle-walking: the domain is < 4n, so each walk ends after a few steps on average.
        while outside.any():
            out[outside] = self._encrypt(out[outside])
            outside = out >= np.uint64(self.n)
        return out.astype(np.int64).reshape(idx.shape)
