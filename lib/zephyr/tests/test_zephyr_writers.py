import gzip
import json
import os
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard

from fray.cluster import LocalClient, WorkerLostError
from zephyr import Dataset, current_worker_context
from zephyr.token_cache import TokenCache
from zephyr.writers import write_jsonl

# Functions of this module travel to worker processes by value (the module itself is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _records(n=25):
    return [{"id": i, "text": f"document {i} " + "é" * (i % 3)} for i in range(n)]


def _read_jsonl(path):
    opener = gzip.open if path.endswith(".gz") else open
    if path.endswith(".zst"):
        with open(path, "rb") as handle:
            data = zstandard.ZstdDecompressor().stream_reader(handle).read()
        return [json.loads(line) for line in data.decode().splitlines()]
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_write_jsonl_round_trips_each_compression(tmp_path, suffix):
    ds = Dataset.from_list(_records(), num_shards=3)
    result = write_jsonl(ds, str(tmp_path / ("part-{shard:05d}-of-{num_shards:05d}" + suffix)), backend="inline")
    assert [os.path.basename(p) for p in result.outputs] == [f"part-0000{i}-of-00003{suffix}" for i in range(3)]
    assert [r for path in result.outputs for r in _read_jsonl(path)] == _records()


def test_write_parquet_round_trips_and_directory_output(tmp_path):
    result = Dataset.from_list(_records(), num_shards=2).write_parquet(str(tmp_path / "out"), backend="inline")
    assert [os.path.basename(p) for p in result.outputs] == ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    rows = [row for path in result.outputs for row in pq.read_table(path).to_pylist()]
    assert rows == _records()


def test_failed_shard_leaves_no_output_file(tmp_path):
    def explode_late(x):
        if x == 7:
            raise RuntimeError("crash mid-shard")
        return {"x": x}

    with pytest.raises(RuntimeError, match="crash mid-shard"):
        Dataset.from_list(range(10), num_shards=1).map(explode_late).write_jsonl(str(tmp_path / "o"), backend="inline")
    assert not (tmp_path / "o").exists() or os.listdir(tmp_path / "o") == []


def test_skip_existing_reruns_only_missing_shards(tmp_path):
    def counted(x):
        current_worker_context().increment("computed")
        return {"x": x}

    ds = Dataset.from_list(range(12), num_shards=4).map(counted)
    pattern = str(tmp_path / "part-{shard}.jsonl")
    first = ds.write_jsonl(pattern, backend="inline", skip_existing=True)
    assert first.counters == {"computed": 12} and first.skipped_shards == []
    os.remove(first.outputs[2])
    second = ds.write_jsonl(pattern, backend="inline", skip_existing=True)
    assert second.skipped_shards == [0, 1, 3]
    assert second.counters == {"computed": 3}
    assert second.outputs == first.outputs
    assert _read_jsonl(second.outputs[2]) == [{"x": 6}, {"x": 7}, {"x": 8}]


def test_token_cache_writer_over_dataset_and_skip_existing(tmp_path):
    documents = [list(range(i, i + (i % 5))) for i in range(30)]
    url = str(tmp_path / "cache")
    result = Dataset.from_list(documents, num_shards=3).write_token_cache(url, vocab_size=1000, metadata={"m": 1},
                                                                          backend="inline")
    assert result.finalized["documents"] == 30 and result.finalized["metadata"] == {"m": 1}
    cache = TokenCache.open(url)
    assert [cache.document(i).tolist() for i in range(30)] == documents
    # Crash-like state: shard 1 lost its summary and the ledger was never written.
    os.remove(os.path.join(url, "shard-00001", "shard.json"))
    os.remove(os.path.join(url, "ledger.json"))
    rerun = Dataset.from_list(documents, num_shards=3).write_token_cache(url, vocab_size=1000, metadata={"m": 1},
                                                                         backend="inline", skip_existing=True)
    assert rerun.skipped_shards == [0, 2]
    assert TokenCache.open(url).read_tokens(0, cache.num_tokens).tolist() == [t for d in documents for t in d]


def _tokenize_like(record):
    return [ord(c) % 500 for c in record["text"][:200]]


def _pipeline(texts):
    # Short texts among the stories, so the filter drops some.
    records = [{"text": text if i % 10 else text[:40]} for i, text in enumerate(texts)]
    return Dataset.from_list(records, num_shards=4).filter(lambda r: len(r["text"]) > 50)


def test_process_pool_matches_in_process_output(tmp_path, synthetic_stories):
    backend = LocalClient(processes=True, max_workers=2)
    outputs = {}
    texts = synthetic_stories[:120]
    for name, chosen in [("inline", "inline"), ("pool", backend)]:
        jsonl = _pipeline(texts).map(lambda r: {"text": r["text"].upper()}).reshard(3).write_jsonl(
            str(tmp_path / name / "part-{shard}.jsonl.gz"), backend=chosen)
        cache = _pipeline(texts).map(_tokenize_like).write_token_cache(str(tmp_path / name / "cache"), vocab_size=500,
                                                                       metadata={}, backend=chosen)
        outputs[name] = (jsonl, cache)
    for index in range(3):
        inline_bytes = (tmp_path / "inline" / f"part-{index}.jsonl.gz").read_bytes()
        assert inline_bytes == (tmp_path / "pool" / f"part-{index}.jsonl.gz").read_bytes()
    for shard in range(4):
        for name in ("tokens.bin", "offsets.bin", "shard.json"):
            assert (tmp_path / "inline" / "cache" / f"shard-0000{shard}" / name).read_bytes() == \
                (tmp_path / "pool" / "cache" / f"shard-0000{shard}" / name).read_bytes()
    assert outputs["inline"][1].finalized == outputs["pool"][1].finalized
    assert TokenCache.open(str(tmp_path / "pool" / "cache")).num_documents > 100


def test_process_pool_reports_worker_errors_and_counters(tmp_path):
    def check(x):
        current_worker_context().increment("checked")
        if x == 5:
            raise ValueError("element 5 is invalid")
        return x

    backend = LocalClient(processes=True, max_workers=2)
    with pytest.raises(ValueError, match="element 5 is invalid"):
        Dataset.from_list(range(8), num_shards=2).map(check).collect(backend=backend)
    result = Dataset.from_list(range(4), num_shards=2).map(check).write_jsonl(str(tmp_path / "o"), backend=backend)
    assert result.counters == {"checked": 4}
    assert np.sum([len(_read_jsonl(p)) for p in result.outputs]) == 4


def test_remote_fsspec_round_trip_through_from_files():
    from zephyr.readers import DocumentReader

    base = "memory://zephyr-writers-test"
    result = Dataset.from_list(_records(6), num_shards=2).write_jsonl(f"{base}/part-{{shard}}.jsonl.zst", backend="inline")
    assert result.outputs == [f"{base}/part-0.jsonl.zst", f"{base}/part-1.jsonl.zst"]
    ds = Dataset.from_files(f"{base}/*.jsonl.zst")
    assert ds.num_source_shards == 2
    assert ds.flat_map(DocumentReader()).collect(backend="inline") == [r["text"] for r in _records(6)]
    # A folder lists its files recursively; in-progress temporary files are never inputs.
    import fsspec

    fsspec.filesystem("memory").pipe("/zephyr-writers-test/part-2.jsonl.tmp-abc", b"partial")
    listed = Dataset.from_files(base).collect(backend="inline")
    assert [url.replace("memory:///", "memory://") for url in listed] == result.outputs


def _die_at(document):
    kill_at = current_worker_context().shared.get("kill_at")
    if kill_at is not None and document[0] == kill_at:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return document


def test_sigkilled_token_cache_run_resumes_to_identical_cache(tmp_path):
    from zephyr.token_cache import IncompleteTokenCacheError, read_shard_summary

    documents = [[i] + [(i * 7 + j) % 300 for j in range(i % 11)] for i in range(80)]
    ds = Dataset.from_list(documents, num_shards=4).map(_die_at)
    clean = str(tmp_path / "clean")
    ds.write_token_cache(clean, vocab_size=300, metadata={"k": "v"}, backend="inline")

    crashed = str(tmp_path / "crashed")
    with pytest.raises(WorkerLostError, match="worker process died"):
        ds.write_token_cache(crashed, vocab_size=300, metadata={"k": "v"}, backend=LocalClient(processes=True, max_workers=2),
                             shared={"kill_at": 45}, skip_existing=True)
    assert read_shard_summary(os.path.join(crashed, "shard-00002")) is None  # the killed shard is not counted
    with pytest.raises(IncompleteTokenCacheError):
        TokenCache.open(crashed)

    rerun = ds.write_token_cache(crashed, vocab_size=300, metadata={"k": "v"}, backend=LocalClient(processes=True, max_workers=2),
                                 skip_existing=True)
    assert 2 not in rerun.skipped_shards
    for shard in range(4):
        folder = f"shard-0000{shard}"
        assert sorted(os.listdir(os.path.join(crashed, folder))) == ["offsets.bin", "shard.json", "tokens.bin"]
        for name in ("tokens.bin", "offsets.bin"):
            assert Path(crashed, folder, name).read_bytes() == Path(clean, folder, name).read_bytes()
    assert Path(crashed, "ledger.json").read_bytes() == Path(clean, "ledger.json").read_bytes()


def _fail_fast_or_linger(x):
    import time

    if x == 0:
        raise RuntimeError("shard 0 fails at once")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # stands in for a long shard; only termination ends it early
        time.sleep(0.05)
    return {"x": x}


def test_a_failed_shard_stops_the_other_workers(tmp_path):
    with pytest.raises(RuntimeError, match="fails at once"):
        Dataset.from_list([0, 1], num_shards=2).map(_fail_fast_or_linger).write_jsonl(
            str(tmp_path / "part-{shard}.jsonl"), backend=LocalClient(processes=True, max_workers=2))
    assert not (tmp_path / "part-1.jsonl").exists()
