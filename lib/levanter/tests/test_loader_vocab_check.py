"""Training refuses a cache whose token ids do not fit the model's vocabulary, naming where they are."""

from __future__ import annotations

import numpy as np
import pytest

from levanter.data import CacheSource, build_text_data
from zephyr.token_cache import TokenCacheError, finalize_token_cache, write_token_cache_shard

TOKENIZER_VOCAB = 1000


def _write_cache(url: str, shards: list[list[list[int]]]) -> str:
    names = [f"shard-{i:05d}" for i in range(len(shards))]
    for name, documents in zip(names, shards):
        write_token_cache_shard(f"{url}/{name}", documents, np.uint16)
    finalize_token_cache(url, names, vocab_size=TOKENIZER_VOCAB, metadata={})
    return url


@pytest.fixture
def caches(tmp_path):
    small = [[list(range(1, 40))], [list(range(40, 80))]]
    # The tokenizer's vocabulary is 1000, but the train cache's second shard uses id 120.
    train = _write_cache(str(tmp_path / "train"), [small[0], [list(range(60, 100)) + [120]]])
    clean = _write_cache(str(tmp_path / "clean"), small)
    return train, clean


def _build(source: CacheSource, vocab_size: int | None):
    return build_text_data([source], seq_len=8, batch_size=2, vocab_size=vocab_size)


def test_train_cache_with_id_beyond_the_model_vocab_names_shard_id_and_vocab(caches):
    train, _ = caches
    with pytest.raises(TokenCacheError, match=r"train/shard-00001.*120.*vocab_size=100"):
        _build(CacheSource("web", train=train), vocab_size=100)


def test_validation_cache_is_checked_too(caches):
    train, clean = caches
    with pytest.raises(TokenCacheError, match=r"train/shard-00001.*120.*vocab_size=100"):
        _build(CacheSource("web", train=clean, validation=train), vocab_size=100)


def test_ids_that_fit_or_no_vocab_given_build_normally(caches):
    train, _ = caches
    for vocab_size in (121, None):
        data = _build(CacheSource("web", train=train), vocab_size=vocab_size)
        batch = data.train.batch_at(0)
        assert batch.tokens.shape == (2, 8)
