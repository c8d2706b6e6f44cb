import json
import os

import numpy as np
import pytest

from zephyr.token_cache import (
    CorruptTokenCacheError,
    IncompleteTokenCacheError,
    TokenCache,
    TokenCacheShardWriter,
    dtype_for_vocab,
    finalize_token_cache,
    read_shard_summary,
    shard_name,
    write_token_cache_shard,
)


def _documents(seed, count, vocab):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(0, 40))).tolist() for _ in range(count)]


@pytest.fixture(scope="module")
def three_shard_cache(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache"))
    shards = [_documents(seed, count, 50_000) for seed, count in [(0, 30), (1, 0), (2, 25)]]
    for index, docs in enumerate(shards):
        write_token_cache_shard(os.path.join(root, shard_name(index)), docs, dtype_for_vocab(50_000))
    ledger = finalize_token_cache(root, [shard_name(i) for i in range(3)], vocab_size=50_000, metadata={"tokenizer": "t"})
    return root, [d for docs in shards for d in docs], ledger


def test_dtype_follows_vocab_size():
    assert dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(65537) == np.uint32


def test_round_trip_documents_tokens_and_boundaries(three_shard_cache):
    root, documents, ledger = three_shard_cache
    cache = TokenCache.open(root)
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in documents])
    assert cache.num_documents == len(documents) == ledger["documents"]
    assert cache.num_tokens == flat.size == ledger["tokens"]
    assert cache.dtype == np.uint16
    assert cache.metadata == {"tokenizer": "t"}
    assert [s["documents"] for s in ledger["shards"]] == [30, 0, 25]
    for i in (0, 1, 29, 30, 54, -1):
        np.testing.assert_array_equal(cache.document(i), documents[i])
    bounds = cache.document_boundaries()
    assert bounds.dtype == np.int64 and bounds[0] == 0 and bounds[-1] == flat.size
    np.testing.assert_array_equal(np.diff(bounds), [len(d) for d in documents])
    # Ranges inside one shard, across the empty shard, and the whole stream.
    shard0_tokens = ledger["shards"][0]["tokens"]
    for start, stop in [(0, 5), (3, shard0_tokens + 7), (shard0_tokens, flat.size), (0, flat.size), (10, 10)]:
        np.testing.assert_array_equal(cache.read_tokens(start, stop), flat[start:stop])
    with pytest.raises(IndexError):
        cache.read_tokens(0, flat.size + 1)
    with pytest.raises(IndexError):
        cache.document(len(documents))


def test_on_disk_format_matches_contract(three_shard_cache):
    root, documents, _ = three_shard_cache
    with open(os.path.join(root, "ledger.json")) as handle:
        ledger = json.load(handle)
    assert ledger["format"] == "marin-token-cache/2" and ledger["dtype"] == "uint16" and ledger["vocab_size"] == 50_000
    tokens = np.fromfile(os.path.join(root, "shard-00000", "tokens.bin"), dtype="<u2")
    offsets = np.fromfile(os.path.join(root, "shard-00000", "offsets.bin"), dtype="<i8")
    assert offsets.size == 31 and offsets[0] == 0 and offsets[-1] == tokens.size
    np.testing.assert_array_equal(tokens[offsets[4] : offsets[5]], documents[4])
    with open(os.path.join(root, "shard-00000", "shard.json")) as handle:
        summary = json.load(handle)
    assert {k: summary[k] for k in ("documents", "tokens", "dtype", "max_token_id")} == {
        "documents": 30, "tokens": int(tokens.size), "dtype": "uint16", "max_token_id": int(tokens.max())}
    assert set(summary["checksums"]) == {"tokens.bin", "offsets.bin"}


def test_remote_fsspec_url_reads_same_bytes():
    url = "memory://zephyr-token-cache-test"
    documents = _documents(7, 20, 100_000)
    write_token_cache_shard(f"{url}/shard-00000", documents[:12], dtype_for_vocab(100_000))
    write_token_cache_shard(f"{url}/shard-00001", documents[12:], dtype_for_vocab(100_000))
    finalize_token_cache(url, [f"{url}/shard-00000", "shard-00001"], vocab_size=100_000, metadata={})
    cache = TokenCache.open(url)
    flat = np.concatenate([np.asarray(d) for d in documents])
    assert cache.dtype == np.uint32
    np.testing.assert_array_equal(cache.read_tokens(0, flat.size), flat)
    np.testing.assert_array_equal(cache.read_tokens(5, 50), flat[5:50])
    np.testing.assert_array_equal(cache.document(15), documents[15])


def test_writer_streams_in_chunks_and_rejects_out_of_range_ids(tmp_path, monkeypatch):
    import zephyr.token_cache.writer as token_cache_writer

    monkeypatch.setattr(token_cache_writer, "_WRITE_CHUNK_TOKENS", 16)
    documents = _documents(3, 40, 1000)
    summary = write_token_cache_shard(str(tmp_path / "s"), (np.asarray(d) for d in documents), np.uint16)
    assert summary.documents == 40 and summary.tokens == sum(len(d) for d in documents)
    with pytest.raises(ValueError, match="out of range"):
        write_token_cache_shard(str(tmp_path / "bad"), [[1, 2, 70_000]], np.uint16)
    # The failed shard left nothing that could be read as finished, nor stray files.
    assert read_shard_summary(str(tmp_path / "bad")) is None
    assert os.listdir(tmp_path / "bad") == []


def test_half_written_shard_is_never_read_or_counted(tmp_path):
    root = str(tmp_path)
    write_token_cache_shard(os.path.join(root, "shard-00000"), [[1, 2, 3]], np.uint16)
    # Kill-like state for shard 1: arrays on disk, no shard.json.
    writer = TokenCacheShardWriter(os.path.join(root, "shard-00001"), np.uint16)
    writer.write([4, 5])
    writer._flush()  # bytes reach the temporary files, as if the process died right here
    assert read_shard_summary(os.path.join(root, "shard-00001")) is None
    with pytest.raises(IncompleteTokenCacheError, match="shard-00001"):
        finalize_token_cache(root, ["shard-00000", "shard-00001"], vocab_size=100, metadata={})
    # No ledger yet: the cache as a whole refuses to open.
    with pytest.raises(IncompleteTokenCacheError, match="ledger.json"):
        TokenCache.open(root)
    writer.abort()


def test_rewriting_a_finished_shard_hides_it_until_done(tmp_path):
    shard = str(tmp_path / "shard-00000")
    write_token_cache_shard(shard, [[1, 2, 3]], np.uint16)
    writer = TokenCacheShardWriter(shard, np.uint16)
    assert read_shard_summary(shard) is None  # the old summary is gone before new bytes land
    writer.write([9])
    summary = writer.finish()
    assert summary.tokens == 1 and read_shard_summary(shard).tokens == 1


def test_missing_cache_and_corrupt_shard(tmp_path):
    with pytest.raises(FileNotFoundError):
        TokenCache.open(str(tmp_path / "nope"))
    root = str(tmp_path / "c")
    write_token_cache_shard(os.path.join(root, "shard-00000"), [[1, 2, 3, 4]], np.uint16)
    finalize_token_cache(root, ["shard-00000"], vocab_size=100, metadata={})
    with open(os.path.join(root, "shard-00000", "tokens.bin"), "r+b") as handle:
        handle.truncate(4)
    with pytest.raises(CorruptTokenCacheError, match="tokens.bin"):
        TokenCache.open(root).read_tokens(0, 1)
