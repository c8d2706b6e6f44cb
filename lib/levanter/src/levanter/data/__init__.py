"""Training data: fixed-length windows over token caches, shuffled, mixed and prefetched."""

from levanter.data.batch import Batch
from levanter.data.loader import DataLoader, EpochShuffle, EvalBatches
from levanter.data.mixture import MixtureSchedule, block_counts
from levanter.data.permutation import FeistelPermutation
from levanter.data.text import CacheSource, TextData, build_text_data
from levanter.data.windows import NotEnoughTokensError, TokenWindows, split_heldout

__all__ = [
    "Batch",
    "CacheSource",
    "DataLoader",
    "EpochShuffle",
    "EvalBatches",
    "FeistelPermutation",
    "MixtureSchedule",
    "NotEnoughTokensError",
    "TextData",
    "TokenWindows",
    "block_counts",
    "build_text_data",
    "split_heldout",
]
