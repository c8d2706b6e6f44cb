"""A token cache proves its own integrity when opened: checksums, sizes, token ids and a safe ledger."""

import json
import os

import numpy as np
import pytest
import xxhash

from zephyr.token_cache import (
    CorruptTokenCacheError,
    TokenCache,
    TokenCacheError,
    dtype_for_vocab,
    finalize_token_cache,
    read_shard_summary,
    shard_name,
    write_token_cache_shard,
)

VOCAB = 1000
# Shard 1 holds the largest id (990); shard 2 is empty.
SHARDS = [[[1, 2, 3], [4, 5, 6, 7]], [[8, 990], [10, 11, 12]], []]


def _write_cache(root: str, shards=SHARDS, vocab_size: int = VOCAB) -> dict:
    for index, documents in enumerate(shards):
        write_token_cache_shard(f"{root}/{shard_name(index)}", documents, dtype_for_vocab(vocab_size))
    return finalize_token_cache(root, [shard_name(i) for i in range(len(shards))], vocab_size=vocab_size)


def _flip_byte(path: str, position: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte[0] ^ 0x01]))


def _rewrite_ledger(root: str, change) -> None:
    path = os.path.join(root, "ledger.json")
    with open(path) as handle:
        ledger = json.load(handle)
    change(ledger)
    with open(path, "w") as handle:
        json.dump(ledger, handle)


@pytest.fixture
def cache_dir(tmp_path):
    root = str(tmp_path / "cache")
    _write_cache(root)
    return root


def test_shard_records_checksums_and_max_id_matching_an_independent_hash(cache_dir):
    with open(os.path.join(cache_dir, "ledger.json")) as handle:
        ledger = json.load(handle)
    for index, documents in enumerate(SHARDS):
        folder = os.path.join(cache_dir, shard_name(index))
        expected = {}
        for name in ("tokens.bin", "offsets.bin"):
            with open(os.path.join(folder, name), "rb") as handle:
                expected[name] = "xxh3_64:" + xxhash.xxh3_64_hexdigest(handle.read())
        flat = [t for d in documents for t in d]
        max_id = max(flat) if flat else None
        with open(os.path.join(folder, "shard.json")) as handle:
            summary = json.load(handle)
        assert summary["checksums"] == expected and summary["max_token_id"] == max_id
        assert ledger["shards"][index]["checksums"] == expected
        assert ledger["shards"][index]["max_token_id"] == max_id
    assert ledger["max_token_id"] == 990


@pytest.mark.parametrize("name", ["tokens.bin", "offsets.bin"])
def test_one_flipped_byte_is_refused_naming_the_shard_file(cache_dir, name):
    TokenCache.open(cache_dir)  # intact: opens
    _flip_byte(os.path.join(cache_dir, "shard-00001", name), 3)
    with pytest.raises(CorruptTokenCacheError, match=f"shard-00001/{name}") as caught:
        TokenCache.open(cache_dir)
    message = str(caught.value)
    assert "checksum" in message and "delete" in message and "rerun" in message


def test_truncated_shard_is_refused_at_open_not_at_first_read(cache_dir):
    with open(os.path.join(cache_dir, "shard-00000", "tokens.bin"), "r+b") as handle:
        handle.truncate(4)
    with pytest.raises(CorruptTokenCacheError, match="shard-00000/tokens.bin holds 4 bytes"):
        TokenCache.open(cache_dir)


def test_skipping_checksums_still_checks_sizes(cache_dir):
    _flip_byte(os.path.join(cache_dir, "shard-00001", "tokens.bin"), 0)
    cache = TokenCache.open(cache_dir, verify_checksums=False)  # the policy's cheap mode: no hashing
    assert cache.num_tokens == 12
    with open(os.path.join(cache_dir, "shard-00001", "offsets.bin"), "ab") as handle:
        handle.write(b"\0" * 8)
    with pytest.raises(CorruptTokenCacheError, match="shard-00001/offsets.bin"):
        TokenCache.open(cache_dir, verify_checksums=False)


def test_flipped_byte_on_a_remote_url_is_refused():
    import fsspec

    url = "memory://zephyr-integrity-remote"
    _write_cache(url)
    assert TokenCache.open(url).read_tokens(0, 12).tolist() == list(range(1, 8)) + [8, 990, 10, 11, 12]
    fs = fsspec.filesystem("memory")
    path = "/zephyr-integrity-remote/shard-00000/tokens.bin"
    data = bytearray(fs.cat_file(path))
    data[1] ^= 0x01
    fs.pipe_file(path, bytes(data))
    try:
        with pytest.raises(CorruptTokenCacheError, match="shard-00000/tokens.bin"):
            TokenCache.open(url)
    finally:
        fs.rm("/zephyr-integrity-remote", recursive=True)


def test_corrupt_ledger_json_names_the_file_and_the_remedy(cache_dir):
    with open(os.path.join(cache_dir, "ledger.json"), "w") as handle:
        handle.write('{"format": "marin-token-cache/2", "shards": [')
    with pytest.raises(CorruptTokenCacheError, match="ledger.json") as caught:
        TokenCache.open(cache_dir)
    assert "delete" in str(caught.value) and "rerun" in str(caught.value)


def test_ledger_with_missing_fields_is_a_cache_error_not_a_key_error(cache_dir):
    _rewrite_ledger(cache_dir, lambda ledger: ledger["shards"][0].pop("tokens"))
    with pytest.raises(CorruptTokenCacheError, match="tokens"):
        TokenCache.open(cache_dir)


@pytest.mark.parametrize(
    "bad_path", ["../elsewhere/shard-00000", "/abs/shard-00000", "memory://x/shard-00000", "a/../../b", ""]
)
def test_ledger_may_not_point_reads_outside_its_cache(tmp_path, bad_path):
    # A sibling folder with a perfectly valid shard: following the ledger there would "work".
    write_token_cache_shard(str(tmp_path / "elsewhere" / "shard-00000"), SHARDS[0], np.uint16)
    root = str(tmp_path / "cache")
    _write_cache(root)
    _rewrite_ledger(root, lambda ledger: ledger["shards"][0].update(path=bad_path))
    with pytest.raises(CorruptTokenCacheError, match="inside"):
        TokenCache.open(root)


def test_finalize_refuses_shard_paths_that_escape_the_cache(tmp_path):
    write_token_cache_shard(str(tmp_path / "outside"), SHARDS[0], np.uint16)
    with pytest.raises(ValueError, match="inside"):
        finalize_token_cache(str(tmp_path / "cache"), ["../outside"], vocab_size=VOCAB)


def test_cache_written_before_checksums_is_refused_with_how_to_retokenize(cache_dir):
    def downgrade(ledger):
        ledger["format"] = "marin-token-cache/1"
        ledger.pop("max_token_id")
        for shard in ledger["shards"]:
            shard.pop("checksums")
            shard.pop("max_token_id")

    _rewrite_ledger(cache_dir, downgrade)
    with pytest.raises(TokenCacheError, match="marin-token-cache/1") as caught:
        TokenCache.open(cache_dir)
    assert "checksum" in str(caught.value) and "rerun" in str(caught.value)


def test_old_format_shard_is_not_reused_by_a_resumed_write(tmp_path):
    shard = str(tmp_path / "shard-00000")
    write_token_cache_shard(shard, SHARDS[0], np.uint16)
    with open(os.path.join(shard, "shard.json"), "w") as handle:
        json.dump({"documents": 2, "tokens": 7, "dtype": "uint16"}, handle)  # as format 1 wrote it
    assert read_shard_summary(shard) is None  # so skip_existing rewrites it with checksums


def test_token_id_at_or_above_vocab_size_names_the_shard_id_and_vocab(cache_dir):
    cache = TokenCache.open(cache_dir)
    cache.check_token_ids(991)  # ids 0..990 fit a vocabulary of 991
    with pytest.raises(TokenCacheError, match=r"shard-00001.*990.*vocab_size=990"):
        cache.check_token_ids(990)


def test_negative_ids_never_reach_a_shard(tmp_path):
    # Stored ids are unsigned, so the writer is the one place a negative id can be caught.
    with pytest.raises(ValueError, match="min -1"):
        write_token_cache_shard(str(tmp_path / "shard-00000"), [[3, -1]], np.uint16)


def test_finalize_refuses_ids_beyond_the_caches_own_vocab_size(tmp_path):
    write_token_cache_shard(str(tmp_path / "shard-00000"), [[1, 2], [150]], np.uint16)
    with pytest.raises(ValueError, match=r"shard-00000.*150.*vocab_size=100"):
        finalize_token_cache(str(tmp_path), ["shard-00000"], vocab_size=100)
    assert not os.path.exists(tmp_path / "ledger.json")
