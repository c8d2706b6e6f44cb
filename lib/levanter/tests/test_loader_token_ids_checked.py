"""Token ids are checked against the model's vocabulary from the bytes themselves, not only from the
largest id the ledger records: a cache rewritten by another tokenizer with its checksums updated (so
it verifies) is refused before training, and, when checksums are not verified, at the first window
that holds such an id; the error names the cache's tokenizer and the model's vocabulary."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import xxhash

from levanter.data import CacheSource, build_text_data
from zephyr.token_cache import TokenIdOutOfRangeError, finalize_token_cache, write_token_cache_shard

TOKENIZER = "tokenizer-identity-of-the-cache"


def _checksum(path: str) -> str:
    with open(path, "rb") as f:
        return "xxh3_64:" + xxhash.xxh3_64(f.read()).hexdigest()


def _retokenized_cache(root: str) -> str:
    """A cache written for a 1000-id vocabulary whose tokens were then replaced by another
    tokenizer's (ids up to 5000), with every checksum updated so the files verify; the recorded
    largest id is the old one."""
    url = os.path.join(root, "cache")
    write_token_cache_shard(f"{url}/shard-00000", [list(range(1, 65))], np.uint16)
    finalize_token_cache(url, ["shard-00000"], vocab_size=1000, metadata={"tokenizer": TOKENIZER})
    tokens_path = f"{url}/shard-00000/tokens.bin"
    tokens = np.fromfile(tokens_path, dtype="<u2")
    tokens[10] = 5000
    tokens.tofile(tokens_path)
    checksum = _checksum(tokens_path)
    for path, shards in ((f"{url}/shard-00000/shard.json", None), (f"{url}/ledger.json", "shards")):
        with open(path) as f:
            record = json.load(f)
        for shard in record[shards] if shards else [record]:
            shard["checksums"]["tokens.bin"] = checksum
        with open(path, "w") as f:
            json.dump(record, f)
    return url


def test_a_cache_whose_recorded_largest_id_is_stale_is_refused_before_training(tmp_path):
    url = _retokenized_cache(str(tmp_path))
    with pytest.raises(TokenIdOutOfRangeError) as caught:
        build_text_data([CacheSource("web", train=url)], seq_len=8, batch_size=2, vocab_size=1000,
                        model="the nano Llama")
    message = str(caught.value)
    assert "the nano Llama has vocab_size=1000" in message
    assert "shard-00000" in message and "5000" in message and "vocab_size=1000" in message
    assert TOKENIZER in message


def test_without_checksum_verification_the_first_window_holding_the_id_is_refused(tmp_path):
    url = _retokenized_cache(str(tmp_path))
    data = build_text_data([CacheSource("web", train=url)], seq_len=8, batch_size=2, vocab_size=1000,
                           verify_checksums=False, heldout_fraction=0.2)
    # Token 10 lies in window 1, which is a train or a validation window: reading them all reaches it.
    with pytest.raises(TokenIdOutOfRangeError, match=r"5000.*vocab_size=1000") as caught:
        for step in range(8):
            data.train.batch_at(step)
        list(data.validation["web"]())
    assert TOKENIZER in str(caught.value)
