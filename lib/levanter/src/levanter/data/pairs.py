"""Preference pairs from a token cache, as padded rows for a preference objective (DPO).

A pair cache (written by Marin's preference data step) holds its documents in pairs: document
``2i`` is pair ``i``'s prompt followed by the chosen reply, document ``2i + 1`` the same prompt
followed by the rejected reply, each with its loss mask on the reply's tokens only. Its metadata
says so (``"layout": PAIR_LAYOUT``); the text loader refuses such a cache and this one refuses any
other, so preference data is never trained on as plain text, nor text as pairs.

Each row of a batch is one document, padded (never packed) to ``seq_len`` with token 0 and mask 0;
a pair's two documents are adjacent rows (chosen first). A document longer than ``seq_len`` loses
tokens from the left, i.e. from the start of its prompt, as long as every reply token keeps a
token before it to be predicted from; a reply that cannot fit is refused with
:class:`PairTooLongError`, naming the pair. Pairs are shuffled per epoch with a permutation seeded
by ``(seed, epoch)``, so ``iter_from(step)`` yields the batches an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from zephyr.token_cache import TokenCache

from levanter.data.batch import Batch
from levanter.errors import LevanterError

PAIR_LAYOUT = "preference-pairs/1"


class PairDataError(LevanterError, ValueError):
    """A cache that is not preference pairs, or pairs that cannot be batched as asked."""


class PairTooLongError(PairDataError):
    """A pair whose reply does not fit in ``seq_len`` even with its whole prompt cut off."""


def is_pair_cache(cache: TokenCache) -> bool:
    return cache.metadata.get("layout") == PAIR_LAYOUT


def pair_row(ids: np.ndarray, mask: np.ndarray, seq_len: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One document as a row: (tokens int32 [seq_len], Batch-style loss mask float32 [seq_len]).

    ``mask`` marks trained tokens; the row's mask at ``t`` weights predicting ``tokens[t + 1]``.
    """
    trained = np.flatnonzero(mask)
    if trained.size == 0:
        raise PairDataError(f"{where} has no reply tokens to compare.")
    cut = max(ids.size - seq_len, 0)
    if cut >= trained[0]:
        raise PairTooLongError(
            f"{where} needs {ids.size - trained[0] + 1} tokens for its reply alone (and one before it), more than "
            f"seq_len={seq_len}; raise seq_len, or leave such pairs out of the data."
        )
    ids, mask = ids[cut:], mask[cut:]
    tokens = np.zeros(seq_len, np.int32)
    loss_mask = np.zeros(seq_len, np.float32)
    tokens[: ids.size] = ids
    loss_mask[: ids.size - 1] = mask[1:]
    return tokens, loss_mask


class PreferencePairs:
    """The trainer's data source over a pair cache: ``iter_from(step)`` yields batches of ``batch_size`` rows."""

    def __init__(self, cache: TokenCache, *, seq_len: int, batch_size: int, seed: int = 0,
                 process_index: int = 0, process_count: int = 1, name: str = "preference pairs"):
        if not is_pair_cache(cache):
            raise PairDataError(f"{name} is not a preference-pair cache (its metadata has no layout {PAIR_LAYOUT!r}); "
                                "declare it with preference_dataset(...).")
        if batch_size % 2 or (batch_size // process_count) % 2:
            raise PairDataError(f"batch_size={batch_size} must hold whole pairs (an even number of rows per process).")
        if cache.num_documents % 2:
            raise PairDataError(f"{name} holds {cache.num_documents} documents, not whole pairs.")
        self.cache = cache
        self.name = name
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.process_index, self.process_count = process_index, process_count
        self.num_pairs = cache.num_documents // 2
        self._order: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))
        if self.num_pairs == 0:
            raise PairDataError(f"{name} holds no pairs.")

    def pair(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Pair ``index`` as two rows: tokens [2, seq_len] and loss mask [2, seq_len]."""
        rows = [pair_row(self.cache.document(2 * index + j).astype(np.int64), self.cache.document_loss_mask(2 * index + j),
                         self.seq_len, f"{self.name} pair {index} ({'chosen' if j == 0 else 'rejected'})") for j in (0, 1)]
        return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])

    def _pair_order(self, epoch: int) -> np.ndarray:
        if self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng((self.seed, epoch)).permutation(self.num_pairs))
        return self._order[1]

    def batch_at(self, step: int) -> Batch:
        pairs_per_batch = self.batch_size // 2
        local = pairs_per_batch // self.process_count
        first = step * pairs_per_batch + self.process_index * local
        picked = []
        for position in range(first, first + local):
            epoch, offset = divmod(position, self.num_pairs)
            picked.append(self.pair(int(self._pair_order(epoch)[offset])))
        tokens = np.concatenate([t for t, _ in picked])
        return Batch(tokens=tokens, loss_mask=np.concatenate([m for _, m in picked]))

    def iter_from(self, start_step: int) -> Iterator[Batch]:
        step = start_step
        while True:
            yield self.batch_at(step)
            step += 1

    def all_pairs(self, batch_size: int | None = None) -> Iterator[Batch]:
        """Every pair once, in order (for evaluation), ``batch_size`` rows at a time (the last batch may be smaller)."""
        rows = batch_size or self.batch_size
        for start in range(0, self.num_pairs, rows // 2):
            picked = [self.pair(i) for i in range(start, min(start + rows // 2, self.num_pairs))]
            yield Batch(tokens=np.concatenate([t for t, _ in picked]), loss_mask=np.concatenate([m for _, m in picked]))


__all__ = ["PAIR_LAYOUT", "PairDataError", "PairTooLongError", "PreferencePairs", "is_pair_cache", "pair_row"]
