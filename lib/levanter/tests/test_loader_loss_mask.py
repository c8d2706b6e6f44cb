"""The loader carries a cache's per-token loss mask into ``Batch.loss_mask``, shifted onto the
position that predicts each token, with documents packed per row as for plain text."""

import numpy as np
import pytest

from levanter.data import Batch, CacheSource, DataLoader, EvalBatches, TokenWindows, build_text_data
from zephyr.token_cache import TokenCache, finalize_token_cache, write_token_cache_shard

SEQ_LEN = 8


def _documents(count: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Documents of 3..9 tokens: a prompt (mask 0) then a reply (mask 1), like a conversation."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        prompt, reply = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        tokens = rng.integers(0, 200, size=prompt + reply).astype(np.uint16)
        docs.append((tokens, np.r_[np.zeros(prompt), np.ones(reply)].astype(np.uint8)))
    return docs


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("masked"))
    docs = _documents(60)
    write_token_cache_shard(f"{root}/shard-00000", docs[:25], np.uint16, loss_mask=True)
    write_token_cache_shard(f"{root}/shard-00001", docs[25:], np.uint16, loss_mask=True)
    finalize_token_cache(root, ["shard-00000", "shard-00001"], vocab_size=256)
    return TokenCache.open(root), docs


def test_window_mask_is_the_targets_mask(masked):
    cache, docs = masked
    windows = TokenWindows.over(cache, SEQ_LEN)
    flat_mask = np.concatenate([mask for _, mask in docs]).astype(np.float32)
    for index in range(len(windows)):
        start = index * SEQ_LEN
        mask = windows.loss_mask(index)
        assert mask.dtype == np.float32 and mask.shape == (SEQ_LEN,)
        # Position t predicts token t + 1: the target's mask decides; the last position has no target.
        np.testing.assert_array_equal(mask[:-1], flat_mask[start + 1 : start + SEQ_LEN])
        assert mask[-1] == 0.0


def test_packed_rows_mask_each_documents_prompt_and_keep_segments(masked):
    cache, docs = masked
    windows = TokenWindows.over(cache, SEQ_LEN)
    boundaries = cache.document_boundaries()
    packed = 0
    for index in range(len(windows)):
        tokens, segments = windows.tokens_and_segments(index)
        mask = windows.loss_mask(index)
        for t in range(SEQ_LEN - 1):
            if segments[t + 1] != segments[t]:
                packed += 1
                # Token t + 1 opens a document with its prompt: predicting it across the boundary never counts.
                assert mask[t] == 0.0
                assert (index * SEQ_LEN + t + 1) in boundaries
    assert packed > 10  # the fixture really packs several documents per row


def test_loader_and_eval_batches_carry_the_mask(masked):
    cache, _ = masked
    windows = TokenWindows.over(cache, SEQ_LEN)
    loader = DataLoader([windows], batch_size=4, shuffle=False)  # step 2 holds windows 8..11, in order
    batch = loader.batch_at(2)
    for row in range(4):
        np.testing.assert_array_equal(batch.tokens[row], windows.tokens_and_segments(8 + row)[0])
        np.testing.assert_array_equal(batch.loss_mask[row], windows.loss_mask(8 + row))
    assert 0 < batch.loss_mask.sum() < batch.loss_mask[:, :-1].size
    evals = list(EvalBatches(windows, batch_size=4)())
    for row in range(4):
        np.testing.assert_array_equal(evals[1].loss_mask[row], windows.loss_mask(4 + row))


def test_a_cache_without_masks_trains_on_every_prediction_as_before(tmp_path, masked):
    _, docs = masked
    root = str(tmp_path / "plain")
    write_token_cache_shard(f"{root}/shard-00000", [tokens for tokens, _ in docs], np.uint16)
    finalize_token_cache(root, ["shard-00000"], vocab_size=256)
    data = build_text_data([CacheSource("plain", root)], seq_len=SEQ_LEN, batch_size=4, heldout_fraction=0.1)
    batch = data.train.batch_at(0)
    expected = Batch.from_tokens(batch.tokens, segment_ids=batch.segment_ids)
    np.testing.assert_array_equal(batch.loss_mask, expected.loss_mask)
    assert batch.loss_mask.dtype == np.float32
