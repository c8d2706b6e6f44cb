"""Zephyr pipelines writing to an object store (moto's S3 server): a killed writer leaves nothing
half-written or temporary for readers to find, and a rerun completes the output exactly."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import pytest
from fray.cluster import LocalClient, WorkerLostError
from rigging import filesystem as fsx
from zephyr import Dataset, current_worker_context
from zephyr.token_cache import IncompleteTokenCacheError, TokenCache, read_shard_summary

# Functions of this module travel to worker processes by value (the module itself is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _die_at(record):
    kill_at = current_worker_context().shared.get("kill_at")
    if kill_at is not None and record["id"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return record


def _tokens(record):
    return [record["id"]] + [ord(c) % 300 for c in record["text"][:40]]


def _records():
    return [{"id": i, "text": f"document {i} " + "word " * (i % 13)} for i in range(80)]


def _visible(url: str) -> list[str]:
    """What a reader listing ``url`` now sees. s3fs caches listings, and a cached listing hides files
    other processes write later, so none is used here or left behind."""
    fs = fsx.filesystem(url)[0]
    fs.invalidate_cache()
    try:
        return fsx.find_files(url)
    finally:
        fs.invalidate_cache()


def test_a_killed_pipeline_on_s3_reruns_to_the_output_of_an_uninterrupted_local_run(s3_prefix, tmp_path):
    dataset = Dataset.from_list(_records(), num_shards=4).map(_die_at)
    local = str(tmp_path / "clean")
    dataset.write_jsonl(local + "/text/part-{shard}.jsonl.gz", backend="inline")
    dataset.map(_tokens).write_token_cache(local + "/cache", vocab_size=300, metadata={"k": "v"}, backend="inline")

    remote = f"{s3_prefix}/out"
    jsonl, cache = remote + "/text/part-{shard}.jsonl.gz", remote + "/cache"
    # Record 45 is in shard 2: its worker dies mid-shard, while the shard's upload is open.
    with pytest.raises(WorkerLostError, match="worker process died"):
        dataset.write_jsonl(jsonl, backend=LocalClient(processes=True, max_workers=2), shared={"kill_at": 45}, skip_existing=True)
    with pytest.raises(WorkerLostError, match="worker process died"):
        dataset.map(_tokens).write_token_cache(cache, vocab_size=300, metadata={"k": "v"}, backend=LocalClient(processes=True, max_workers=2),
                                               shared={"kill_at": 45}, skip_existing=True)
    after_kill = _visible(remote)
    assert "text/part-2.jsonl.gz" not in after_kill  # no half shard
    assert not [name for name in after_kill if fsx.is_temporary_name(name)], after_kill
    assert read_shard_summary(f"{cache}/shard-00002") is None
    with pytest.raises(IncompleteTokenCacheError):
        TokenCache.open(cache)

    text_rerun = dataset.write_jsonl(jsonl, backend=LocalClient(processes=True, max_workers=2), skip_existing=True)
    cache_rerun = dataset.map(_tokens).write_token_cache(cache, vocab_size=300, metadata={"k": "v"},
                                                         backend=LocalClient(processes=True, max_workers=2), skip_existing=True)
    assert 2 not in text_rerun.skipped_shards and 2 not in cache_rerun.skipped_shards
    assert text_rerun.skipped_shards and cache_rerun.skipped_shards  # the finished shards were kept

    expected = sorted(str(p.relative_to(local)) for p in Path(local).rglob("*") if p.is_file())
    assert _visible(remote) == expected  # nothing temporary, nothing extra
    for name in expected:
        assert fsx.open_url(f"{remote}/{name}").read() == Path(local, name).read_bytes(), name
    assert TokenCache.open(cache).num_documents == 80


# A writer process whose every write request to S3 waits first, so that the test can kill it at any
# stage of publishing a shard: here, the moment anything of it becomes visible.
_SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    import fsspec.asyn
    from zephyr.writers import write_jsonl_file

    _sync = fsspec.asyn.sync
    _WRITES = {"_pipe_file", "_mv", "_copy", "_rm", "put_object", "copy_object", "delete_object",
               "complete_multipart_upload"}

    def _slow_sync(loop, func, *args, **kwargs):
        if ({getattr(func, "__name__", "")} | {a for a in args[:2] if isinstance(a, str)}) & _WRITES:
            time.sleep(0.5)
        return _sync(loop, func, *args, **kwargs)

    fsspec.asyn.sync = _slow_sync
    write_jsonl_file(sys.argv[1], ({"id": i, "text": "x" * 100} for i in range(1000)))
    time.sleep(60)
    """
)


def test_a_writer_killed_as_soon_as_its_shard_shows_leaves_it_whole_and_nothing_temporary(s3_prefix, s3_server):
    folder = f"{s3_prefix}/shards"
    target = f"{folder}/part-0.jsonl"
    writer = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, target], env={**os.environ, **s3_server.env})
    try:
        deadline = time.monotonic() + 60
        seen: list[str] = []
        while not seen and time.monotonic() < deadline and writer.poll() is None:
            seen = _visible(folder)
            time.sleep(0.02)
        assert seen, "the writer published nothing within 60 s"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    left = _visible(folder)
    assert not [name for name in left if fsx.is_temporary_name(name)], f"temporary objects left visible: {left}"
    assert left == ["part-0.jsonl"]
    assert len(fsx.open_url(target).read().splitlines()) == 1000  # whole


def test_a_shard_that_fails_after_its_multipart_upload_began_leaves_nothing(s3_prefix, monkeypatch):
    from zephyr.writers import write_jsonl_file

    fs, _ = fsx.filesystem(s3_prefix)
    monkeypatch.setattr(fs, "default_block_size", 5 * 2**20)  # S3's smallest part: a multipart upload after 5 MiB

    def records():
        for i in range(8000):
            yield {"id": i, "text": "y" * 1000}
        raise RuntimeError("the source failed mid-shard")

    target = f"{s3_prefix}/multipart/part-0.jsonl"
    with pytest.raises(RuntimeError, match="mid-shard"):
        write_jsonl_file(target, records())
    assert _visible(f"{s3_prefix}/multipart") == []
    bucket = s3_prefix.removeprefix("s3://").split("/")[0]
    assert fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", []) == []  # aborted, not left to bill
