"""Zephyr's streamed writes to object stores use rigging's temporary names, so the step runner's
cleanup recognises what a killed shard writer leaves behind."""

import fsspec

from rigging import filesystem as fsx
from zephyr._fs import atomic_open, is_temporary_name


def test_object_store_write_streams_to_a_rigging_temporary_then_moves_into_place():
    fs = fsspec.filesystem("memory")
    with atomic_open("memory://zephyr-temp-names/out/part-0.jsonl", "wb") as handle:
        handle.write(b"partial")
        in_progress = fsx.find_files("memory://zephyr-temp-names/out")
    assert len(in_progress) == 1
    assert in_progress[0].startswith(".part-0.jsonl.tmp-")
    assert fsx.is_temporary_name(in_progress[0]) and is_temporary_name(in_progress[0])
    assert fsx.find_files("memory://zephyr-temp-names/out") == ["part-0.jsonl"]
    assert fs.cat("/zephyr-temp-names/out/part-0.jsonl") == b"partial"
