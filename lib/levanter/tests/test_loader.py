"""The training data loader: windows, deterministic shuffle and restart, mixtures, validation, prefetch."""

from __future__ import annotations

import numpy as np
import pytest

from levanter.data import (
    CacheSource,
    DataLoader,
    EvalBatches,
    FeistelPermutation,
    MixtureSchedule,
    NotEnoughTokensError,
    TokenWindows,
    block_counts,
    build_text_data,
    split_heldout,
)
from zephyr.token_cache import TokenCache, finalize_token_cache, write_token_cache_shard

SEQ_LEN = 16


def _write_cache(url: str, documents: list[np.ndarray], shards: int = 2, vocab_size: int = 5000) -> TokenCache:
    per = -(-len(documents) // shards)
    names = []
    for s in range(shards):
        name = f"shard-{s:05d}"
        write_token_cache_shard(f"{url}/{name}", documents[s * per : (s + 1) * per], np.uint16)
        names.append(name)
    finalize_token_cache(url, names, vocab_size=vocab_size, metadata={})
    return TokenCache.open(url)


def _documents(rng: np.random.Generator, count: int, low: int, high: int) -> list[np.ndarray]:
    return [rng.integers(low, high, size=int(rng.integers(1, 40))).astype(np.uint16) for _ in range(count)]


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    rng = np.random.default_rng(0)
    # Token ids tell the datasets apart: A uses [0, 1000), B uses [1000, 2000).
    docs_a = _documents(rng, 120, 0, 1000)
    docs_b = _documents(rng, 60, 1000, 2000)
    return {
        "a": _write_cache(str(root / "a"), docs_a),
        "b": _write_cache(str(root / "b"), docs_b, shards=3),
        "a_docs": docs_a,
    }


def _batches(loader: DataLoader, start: int, count: int) -> list[np.ndarray]:
    iterator = loader.iter_from(start)
    out = [next(iterator).tokens for _ in range(count)]
    iterator.close()
    return out


def test_permutation_is_a_seeded_bijection():
    for n in (1, 2, 7, 1000, 4097):
        values = FeistelPermutation(n, 3)(np.arange(n))
        assert sorted(values.tolist()) == list(range(n))
    first = FeistelPermutation(1000, (1, 0, 0))(np.arange(1000))
    again = FeistelPermutation(1000, (1, 0, 0))(np.arange(1000))
    other = FeistelPermutation(1000, (2, 0, 0))(np.arange(1000))
    np.testing.assert_array_equal(first, again)
    assert (first != other).mean() > 0.9
    assert (first != np.arange(1000)).mean() > 0.9
    assert int(FeistelPermutation(1000, (1, 0, 0))(417)) == first[417]  # any single index, no table


def test_windows_are_the_flat_stream_with_document_segments(caches):
    cache = caches["a"]
    windows = TokenWindows.over(cache, SEQ_LEN)
    assert len(windows) == cache.num_tokens // SEQ_LEN
    flat = np.concatenate(caches["a_docs"]).astype(np.int32)
    doc_of_token = np.repeat(np.arange(len(caches["a_docs"])), [len(d) for d in caches["a_docs"]])
    for i in (0, 1, len(windows) // 2, len(windows) - 1):
        tokens, segments = windows.tokens_and_segments(i)
        np.testing.assert_array_equal(tokens, flat[i * SEQ_LEN : (i + 1) * SEQ_LEN])
        docs = doc_of_token[i * SEQ_LEN : (i + 1) * SEQ_LEN]
        np.testing.assert_array_equal(segments, docs - docs[0])


def test_too_small_cache_is_a_clear_error(caches):
    with pytest.raises(NotEnoughTokensError, match="fewer than one window"):
        TokenWindows.over(caches["a"], caches["a"].num_tokens + 1)


def test_same_seed_same_batches_other_seed_other_order(caches):
    windows = TokenWindows.over(caches["a"], SEQ_LEN)
    first = _batches(DataLoader([windows], batch_size=4, seed=7), 0, 5)
    second = _batches(DataLoader([windows], batch_size=4, seed=7), 0, 5)
    other = _batches(DataLoader([windows], batch_size=4, seed=8), 0, 5)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, c) for a, c in zip(first, other))


def test_restart_at_step_k_matches_uninterrupted_run_across_epochs(caches):
    windows = TokenWindows.over(caches["a"], SEQ_LEN)
    steps = len(windows) // 4 + 6  # runs past the end of the first epoch
    loader = DataLoader([windows, TokenWindows.over(caches["b"], SEQ_LEN)], [0.6, 0.4], batch_size=4, seed=3)
    uninterrupted = _batches(loader, 0, steps)
    k = steps - 9
    restarted = _batches(DataLoader([windows, TokenWindows.over(caches["b"], SEQ_LEN)], [0.6, 0.4], batch_size=4, seed=3), k, 9)
    for a, b in zip(uninterrupted[k:], restarted):
        np.testing.assert_array_equal(a, b)


def test_one_epoch_visits_every_window_once_then_wraps(caches):
    windows = TokenWindows.over(caches["a"], SEQ_LEN)
    n = len(windows)
    loader = DataLoader([windows], batch_size=1, seed=5)
    rows = [loader.sequence(i)[0] for i in range(2 * n)]
    expected = sorted(tuple(windows.tokens_and_segments(i)[0]) for i in range(n))
    assert sorted(tuple(r) for r in rows[:n]) == expected
    assert sorted(tuple(r) for r in rows[n:]) == expected
    assert [tuple(r) for r in rows[:n]] != [tuple(r) for r in rows[n:]]  # each epoch has its own order


def test_mixture_ratio_within_two_percent(caches):
    loader = DataLoader(
        [TokenWindows.over(caches["a"], SEQ_LEN), TokenWindows.over(caches["b"], SEQ_LEN)],
        [0.75, 0.25],
        batch_size=8,
        seed=11,
    )
    batches = _batches(loader, 0, 125)  # 1,000 sequences
    from_a = sum(int((row < 1000).all()) for batch in batches for row in batch)
    from_b = sum(int((row >= 1000).all()) for batch in batches for row in batch)
    assert from_a + from_b == 1000
    assert abs(from_a / 1000 - 0.75) <= 0.02


def test_mixture_schedule_is_exact_per_block_and_counts_without_replay():
    np.testing.assert_array_equal(block_counts([0.75, 0.25], 1024), [768, 256])
    np.testing.assert_array_equal(block_counts([1, 1, 1], 10), [4, 3, 3])
    schedule = MixtureSchedule([0.5, 0.3, 0.2], seed=1, block_size=64)
    seen = [0, 0, 0]
    for g in range(300):
        d, k = schedule.lookup(g)
        assert k == seen[d]  # position in the dataset's stream = how often it was picked before
        seen[d] += 1
    with pytest.raises(ValueError, match="non-negative"):
        block_counts([1.0, -0.5], 8)


def test_processes_get_disjoint_rows_of_the_global_batch(caches):
    windows = TokenWindows.over(caches["a"], SEQ_LEN)
    whole = DataLoader([windows], batch_size=4, seed=2).batch_at(3).tokens
    parts = [DataLoader([windows], batch_size=4, seed=2, process_index=p, process_count=2).batch_at(3).tokens for p in range(2)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    with pytest.raises(ValueError, match="divisible"):
        DataLoader([windows], batch_size=5, process_count=2)


def test_heldout_validation_never_overlaps_train(caches):
    windows = TokenWindows.over(caches["a"], SEQ_LEN)
    train, held = split_heldout(windows, 0.1)
    assert len(train) + len(held) == len(windows) and len(held) >= 1
    train_positions = {train.first + i for i in range(len(train))}
    held_positions = {held.first + i for i in range(len(held))}
    assert not train_positions & held_positions
    loader = DataLoader([train], batch_size=4, seed=0)
    held_rows = {tuple(held.tokens_and_segments(i)[0]) for i in range(len(held))}
    trained = {tuple(loader.sequence(g)[0]) for g in range(3 * len(train))}
    assert not trained & held_rows


def test_build_text_data_uses_source_validation_or_holds_out(caches):
    data = build_text_data(
        [
            CacheSource("a", caches["a"].url, weight=0.5),
            CacheSource("b", caches["b"].url, validation=caches["a"].url, weight=0.5),
        ],
        seq_len=SEQ_LEN,
        batch_size=4,
        heldout_fraction=0.1,
    )
    assert len(data.validation["b"].windows) == len(TokenWindows.over(caches["a"], SEQ_LEN))
    assert len(data.validation["a"].windows) == round(len(TokenWindows.over(caches["a"], SEQ_LEN)) * 0.1)
    batch = next(iter(data.train.iter_from(0)))
    assert batch.tokens.shape == (4, SEQ_LEN) and batch.segment_ids is not None


def test_eval_batches_cover_every_window_once_and_mask_padding(caches):
    windows = TokenWindows.over(caches["b"], SEQ_LEN)
    evals = EvalBatches(windows, batch_size=4)
    batches = list(evals())
    assert len(batches) == -(-len(windows) // 4)
    real_rows = sum(int(b.loss_mask[r].sum() > 0) for b in batches for r in range(4))
    assert real_rows == len(windows)
    np.testing.assert_array_equal(batches[0].tokens[1], windows.tokens_and_segments(1)[0])
    assert list(evals())[0].tokens.tobytes() == batches[0].tokens.tobytes()  # callable again, same pass


def test_prefetch_thread_errors_reach_the_consumer(caches):
    class Broken(TokenWindows):
        def tokens_and_segments(self, index):
            if index >= 0:
                raise OSError("disk went away")

    windows = TokenWindows.over(caches["a"], SEQ_LEN)
    broken = Broken(cache=windows.cache, seq_len=SEQ_LEN, first=0, count=len(windows))
    with pytest.raises(OSError, match="disk went away"):
        next(DataLoader([broken], batch_size=2).iter_from(0))


def test_stop_step_ends_iteration(caches):
    loader = DataLoader([TokenWindows.over(caches["a"], SEQ_LEN)], batch_size=2, prefetch=1)
    assert len(list(loader.iter_from(3, stop_step=7))) == 4
