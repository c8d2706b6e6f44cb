"""Building the training loader and validation sets from token caches.

Each source is a train cache, an optional validation cache and a mixture weight. Validation comes
from the source's own validation split when it has one; otherwise the last ``heldout_fraction`` of
its train windows is held out and never trained on.

Every cache is verified when opened (see ``zephyr.token_cache``: sizes, and checksums unless
``verify_checksums=False``) and, given the model's ``vocab_size``, refused if it holds a token id
the model has no embedding for (verification finds the largest id in the tokens themselves), so a
mismatch fails here, naming the shard and the cache's tokenizer, instead of as NaN losses at the
first step; unverified caches have their ids checked as each window is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from levanter.data.loader import DataLoader, EvalBatches
from levanter.data.mixture import DEFAULT_BLOCK_SIZE
from levanter.data.pairs import PairDataError, is_pair_cache
from levanter.data.reply_coverage import check_reply_coverage
from levanter.data.windows import TokenWindows, split_heldout
from zephyr.token_cache import TokenCache


@dataclass(frozen=True)
class CacheSource:
    """One dataset of a mixture: where its token caches are and how much of each batch it gets."""

    name: str
    train: str
    validation: str | None = None
    weight: float = 1.0


@dataclass(frozen=True, eq=False)
class TextData:
    """What the trainer consumes: ``train.iter_from(step)`` and ``validation[name]()``."""

    train: DataLoader
    validation: dict[str, EvalBatches]


def build_text_data(
    sources: Sequence[CacheSource],
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    heldout_fraction: float = 0.01,
    eval_batch_size: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    prefetch: int = 4,
    mixture_block_size: int = DEFAULT_BLOCK_SIZE,
    vocab_size: int | None = None,
    verify_checksums: bool = True,
    model: str = "the model",
    on_cut_conversation: str = "warn",
) -> TextData:
    """The train loader and validation sets over ``sources``.

    ``vocab_size``: the model's vocabulary; every cache must hold only ids below it (None: no check).
    ``model``: how the error names the model when they do not.
    ``on_cut_conversation``: for chat caches (with a loss mask), ``"warn"`` logs how many
    conversations the windows cut and what becomes of their reply tokens, ``"refuse"`` raises
    instead; windows with no reply token at all are refused either way (:mod:`levanter.data.reply_coverage`).
    ``verify_checksums``: hash every cache file when opening it (sizes are checked either way).
    """
    if not sources:
        raise ValueError("build_text_data needs at least one CacheSource")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"data source names must be unique, got {names}")
    train_sets: list[TokenWindows] = []
    validation: dict[str, EvalBatches] = {}
    for source in sources:
        windows = TokenWindows.over(_open_cache(source.train, vocab_size, verify_checksums, model), seq_len, vocab_size)
        if source.validation is not None:
            held = TokenWindows.over(_open_cache(source.validation, vocab_size, verify_checksums, model), seq_len, vocab_size)
        else:
            windows, held = split_heldout(windows, heldout_fraction)
        check_reply_coverage(windows, held, on_cut_conversation)
        train_sets.append(windows)
        validation[source.name] = EvalBatches(
            held, batch_size=eval_batch_size or batch_size, process_index=process_index, process_count=process_count
        )
    loader = DataLoader(
        train_sets,
        [s.weight for s in sources],
        batch_size=batch_size,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        prefetch=prefetch,
        mixture_block_size=mixture_block_size,
    )
    return TextData(train=loader, validation=validation)


def _open_cache(url: str, vocab_size: int | None, verify_checksums: bool, model: str) -> TokenCache:
    cache = TokenCache.open(url, verify_checksums=verify_checksums)
    if is_pair_cache(cache):
        raise PairDataError(
            f"{url} holds preference pairs (chosen and rejected replies), not text to train on as it is; "
            "train on it with dpo(...), or tokenize the conversations you want with chat_dataset(...)."
        )
    if vocab_size is not None:
        cache.check_token_ids(vocab_size, model)
    return cache
