"""A token cache may carry a per-token loss mask, with the same guarantees as its tokens; a cache
without one is written exactly as before and reads as all ones."""

import hashlib
import json
import os

import numpy as np
import pytest
import xxhash

from zephyr.dataset import Dataset
from zephyr.token_cache import (
    FORMAT,
    FORMAT_WITH_LOSS_MASK,
    LOSS_MASK_NAME,
    CorruptTokenCacheError,
    TokenCache,
    TokenCacheShardWriter,
    finalize_token_cache,
    read_shard_summary,
    shard_name,
    write_token_cache_shard,
)
from zephyr.writers import write_token_cache

# (tokens, mask) per document; shard 1 starts mid-stream so flat reads cross a shard boundary,
# shard 2 is empty.
SHARDS = [
    [([1, 2, 3, 4], [0, 0, 1, 1]), ([5, 6], [1, 0])],
    [([7, 8, 9], [0, 1, 1]), ([10], [0])],
    [],
]


def _write(root: str, shards=SHARDS, loss_mask: bool = True) -> dict:
    for index, documents in enumerate(shards):
        docs = documents if loss_mask else [tokens for tokens, _ in documents]
        write_token_cache_shard(f"{root}/{shard_name(index)}", docs, np.uint16, loss_mask=loss_mask)
    return finalize_token_cache(root, [shard_name(i) for i in range(len(shards))], vocab_size=100)


@pytest.fixture
def masked_cache(tmp_path):
    root = str(tmp_path / "masked")
    _write(root)
    return root


def test_masks_round_trip_per_document_and_across_shards(masked_cache):
    cache = TokenCache.open(masked_cache)
    assert cache.has_loss_mask and cache.ledger["format"] == FORMAT_WITH_LOSS_MASK
    documents = [doc for shard in SHARDS for doc in shard]
    for index, (tokens, mask) in enumerate(documents):
        np.testing.assert_array_equal(cache.document(index), tokens)
        np.testing.assert_array_equal(cache.document_loss_mask(index), mask)
        assert cache.document_loss_mask(index).dtype == np.uint8
    flat_mask = np.concatenate([mask for _, mask in documents])
    np.testing.assert_array_equal(cache.read_loss_mask(0, cache.num_tokens), flat_mask)
    np.testing.assert_array_equal(cache.read_loss_mask(4, 9), flat_mask[4:9])  # crosses into shard 1


def test_mask_file_has_a_checksum_an_independent_hash_reproduces(masked_cache):
    folder = os.path.join(masked_cache, shard_name(0))
    with open(os.path.join(folder, LOSS_MASK_NAME), "rb") as handle:
        data = handle.read()
    assert data == bytes([0, 0, 1, 1, 1, 0])
    assert read_shard_summary(folder).checksums[LOSS_MASK_NAME] == f"xxh3_64:{xxhash.xxh3_64(data).hexdigest()}"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_mask_file_is_refused_when_opened(masked_cache, damage):
    path = os.path.join(masked_cache, shard_name(1), LOSS_MASK_NAME)
    if damage == "flip":
        with open(path, "r+b") as handle:
            handle.write(bytes([1]))  # the first token of shard 1 is masked out: 0 -> 1
        match = "does not match its checksum"
    elif damage == "truncate":
        os.truncate(path, 2)
        match = "holds 2 bytes"
    else:
        os.remove(path)
        match = "is missing"
    with pytest.raises(CorruptTokenCacheError, match=match):
        TokenCache.open(masked_cache)


def test_a_masked_ledger_must_list_every_mask_checksum(masked_cache):
    path = os.path.join(masked_cache, "ledger.json")
    with open(path) as handle:
        ledger = json.load(handle)
    del ledger["shards"][0]["checksums"][LOSS_MASK_NAME]
    with open(path, "w") as handle:
        json.dump(ledger, handle)
    with pytest.raises(CorruptTokenCacheError, match="no xxh3_64 checksum for loss_mask.bin"):
        TokenCache.open(masked_cache)


def test_a_plain_cache_is_written_byte_for_byte_as_format_2(tmp_path):
    # Digests of the files this cache had before loss masks existed: plain caches, and so the hashes
    # and outputs of every tokenize step, are unchanged.
    root = str(tmp_path / "plain")
    write_token_cache_shard(f"{root}/shard-00000", [[5, 6, 7], [8, 9]], np.uint16)
    write_token_cache_shard(f"{root}/shard-00001", [[10], [11, 12, 13, 14]], np.uint16)
    finalize_token_cache(root, ["shard-00000", "shard-00001"], vocab_size=100, metadata={"split": "train"})
    expected = {
        "ledger.json": "3f47fa43cb0accec",
        "shard-00000/offsets.bin": "ca3ce338f5111180",
        "shard-00000/shard.json": "6c9d8daf7fec792d",
        "shard-00000/tokens.bin": "9e44044aea37d375",
        "shard-00001/offsets.bin": "7f202a05cbccc591",
        "shard-00001/shard.json": "290606168ec77140",
        "shard-00001/tokens.bin": "4e59ed23e94454d3",
    }
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()[:16]
    assert found == expected
    cache = TokenCache.open(root)
    assert not cache.has_loss_mask and cache.ledger["format"] == FORMAT
    np.testing.assert_array_equal(cache.read_loss_mask(1, 6), np.ones(5, np.uint8))
    np.testing.assert_array_equal(cache.document_loss_mask(1), [1, 1])


def test_a_cache_mixing_masked_and_plain_shards_is_refused(tmp_path):
    root = str(tmp_path / "mixed")
    write_token_cache_shard(f"{root}/shard-00000", [([1, 2], [0, 1])], np.uint16, loss_mask=True)
    write_token_cache_shard(f"{root}/shard-00001", [[3, 4]], np.uint16)
    with pytest.raises(ValueError, match="mixes shards with loss masks"):
        finalize_token_cache(root, ["shard-00000", "shard-00001"], vocab_size=100)
    with pytest.raises(ValueError, match="lack loss masks"):
        finalize_token_cache(root, ["shard-00001"], vocab_size=100, loss_mask=True)
    assert not os.path.exists(os.path.join(root, "ledger.json"))


@pytest.mark.parametrize(
    "tokens, mask, message",
    [
        ([1, 2, 3], [1, 0], "a loss mask of shape"),
        ([1, 2], [0, 2], "0s and 1s only"),
        ([1, 2], [0.0, 1.0], "the integers 0 and 1, got dtype float64"),
        ([1, 2], None, "has no loss mask"),
    ],
)
def test_writer_refuses_a_mask_that_does_not_fit_its_document(tmp_path, tokens, mask, message):
    with TokenCacheShardWriter(str(tmp_path / "shard"), np.uint16, loss_mask=True) as writer:
        with pytest.raises(ValueError, match=message):
            writer.write(tokens, mask)
    with TokenCacheShardWriter(str(tmp_path / "plain"), np.uint16) as writer:
        with pytest.raises(ValueError, match="without loss masks"):
            writer.write([1, 2], [1, 1])


def test_a_failed_masked_write_leaves_no_finished_shard(tmp_path):
    url = str(tmp_path / "shard")
    with pytest.raises(RuntimeError):
        with TokenCacheShardWriter(url, np.uint16, loss_mask=True) as writer:
            writer.write([1, 2], [0, 1])
            raise RuntimeError("worker died")
    assert read_shard_summary(url) is None
    assert not os.path.exists(os.path.join(url, LOSS_MASK_NAME))


def test_pipeline_writes_token_and_mask_pairs_and_reuses_finished_shards(tmp_path):
    url = str(tmp_path / "cache")
    pairs = [(np.array(tokens), np.array(mask)) for shard in SHARDS for tokens, mask in shard]
    dataset = Dataset.from_list(pairs, num_shards=2)
    first = write_token_cache(dataset, url, vocab_size=100, loss_mask=True, skip_existing=True)
    assert first.finalized["format"] == FORMAT_WITH_LOSS_MASK
    again = write_token_cache(dataset, url, vocab_size=100, loss_mask=True, skip_existing=True)
    assert again.skipped_shards == [0, 1]
    # The same shards asked for without masks are not this write's output: they are rewritten.
    plain = Dataset.from_list([tokens for tokens, _ in pairs], num_shards=2)
    rewritten = write_token_cache(plain, url, vocab_size=100, skip_existing=True)
    assert not rewritten.skipped_shards and rewritten.finalized["format"] == FORMAT
    assert not TokenCache.open(url).has_loss_mask
    assert not os.path.exists(os.path.join(url, shard_name(0), LOSS_MASK_NAME))
