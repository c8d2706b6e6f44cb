"""Where a data step's shards run when its declaration names no backend."""

import logging

import pytest
from marin.execution.running import shard_backend
from marin.execution.running.shard_backend import default_backend


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"part-{i}.jsonl"
        path.write_text("x" * 100)
        paths.append(str(path))
    return paths


def test_small_inputs_and_single_shards_run_in_this_process(files, monkeypatch):
    monkeypatch.setattr(shard_backend, "unguarded_top_level_line", lambda: None)
    assert default_backend(3, files) == "inline"  # 300 bytes: worker start-up would cost more
    monkeypatch.setattr(shard_backend, "PROCESS_POOL_MIN_BYTES", 250)
    assert default_backend(1, files) == "inline"  # one shard: nothing to run side by side
    assert default_backend(3, files[:2]) == "inline"  # 200 bytes
    assert default_backend(3, files) == "processes"


def test_an_unguarded_script_gets_this_process_and_a_warning_saying_how(files, monkeypatch, caplog):
    monkeypatch.setattr(shard_backend, "PROCESS_POOL_MIN_BYTES", 250)
    monkeypatch.setattr(shard_backend, "unguarded_top_level_line", lambda: ("curate.py", 12))
    with caplog.at_level(logging.WARNING, logger=shard_backend.__name__):
        assert default_backend(3, files, "dedup shards") == "inline"
    assert "Running 3 dedup shards in this process: curate.py, line 12" in caplog.text
    assert "if __name__ == \"__main__\":" in caplog.text
