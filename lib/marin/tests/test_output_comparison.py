"""Comparing a step's output with a rerun (what ``marin reproduce`` prints), and a runner that reads
some steps' outputs from elsewhere without running or writing them."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin.execution.reproducibility.output_comparison import Placement, compare_outputs
from marin.execution.reproducibility.record_diff import byte_difference, jsonl_difference
from marin.execution.planning.run_defaults import RunOptionError
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec
from marin.execution.reproducibility.tensor_diff import array_difference


def _folders(tmp_path: Path) -> tuple[Path, Path, Placement]:
    a, b = tmp_path / "a" / "step-1", tmp_path / "b" / "step-1"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    return a, b, Placement(str(a), str(b), str(tmp_path / "a"), str(tmp_path / "b"))


def _write(folder: Path, name: str, text: str | bytes) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _metrics(losses, wall_times) -> str:
    return "".join(json.dumps({"step": i, "loss": loss, "wall_time": t, "tokens_per_second": 1 / t}) + "\n"
                   for i, (loss, t) in enumerate(zip(losses, wall_times)))


def test_times_and_rates_never_count_but_a_changed_loss_is_named_by_record(tmp_path):
    a, b, placement = _folders(tmp_path)
    _write(a, "metrics.jsonl", _metrics([3.0, 2.5, 2.25], [1.0, 2.0, 3.0]))
    _write(b, "metrics.jsonl", _metrics([3.0, 2.5, 2.25], [1.5, 2.5, 3.5]))
    assert compare_outputs(placement).identical

    _write(b, "metrics.jsonl", _metrics([3.0, 2.5, 2.2500001], [1.5, 2.5, 3.5]))
    (difference,) = compare_outputs(placement).differences
    assert difference.path == "metrics.jsonl"
    assert difference.what == "record 2 differs: loss: 2.25 in the original, 2.2500001 in the rerun"


def test_compressed_records_are_compared_by_content_not_by_the_gzip_header_time(tmp_path):
    a, b, placement = _folders(tmp_path)
    records = "".join(json.dumps({"id": i, "text": f"document {i}"}) + "\n" for i in range(50)).encode()
    _write(a, "data/part-0.jsonl.gz", gzip.compress(records, mtime=1))
    _write(b, "data/part-0.jsonl.gz", gzip.compress(records, mtime=2))
    assert (a / "data/part-0.jsonl.gz").read_bytes() != (b / "data/part-0.jsonl.gz").read_bytes()
    assert compare_outputs(placement).identical

    _write(b, "data/part-0.jsonl.gz", gzip.compress(records.replace(b"document 41", b"document 14"), mtime=2))
    (difference,) = compare_outputs(placement).differences
    assert difference.what == "record 41 differs: text: 'document 41' in the original, 'document 14' in the rerun"


def test_missing_records_files_and_bytes_are_each_located(tmp_path):
    a, b, placement = _folders(tmp_path)
    _write(a, "x.jsonl", '{"n": 1}\n{"n": 2}\n{"n": 3}\n')
    _write(b, "x.jsonl", '{"n": 1}\n')
    assert jsonl_difference(str(a / "x.jsonl"), str(b / "x.jsonl"), lambda v: v) == (
        "record 1: only in the original (the original has 3 records, the other 1)"
    )
    _write(a, "blob.bin", bytes(range(200)))
    _write(b, "blob.bin", bytes(range(100)) + b"\xff" + bytes(range(101, 200)))
    assert byte_difference(str(a / "blob.bin"), str(b / "blob.bin")) == "bytes differ from offset 100"
    _write(a, "only-here.txt", "x")
    comparison = compare_outputs(placement, stop_at_first=False)
    assert [(d.path, d.what.split(":")[0]) for d in comparison.differences] == [
        ("blob.bin", "bytes differ from offset 100"), ("only-here.txt", "only in the original"), ("x.jsonl", "record 1"),
    ]


def test_parquet_rows_are_compared_as_values(tmp_path):
    a, b, placement = _folders(tmp_path)
    (a / "data").mkdir()
    (b / "data").mkdir()
    table = pa.table({"id": list(range(3000)), "kept": [True] * 3000})
    pq.write_table(table, a / "data/part-0.parquet", row_group_size=1000)
    pq.write_table(table, b / "data/part-0.parquet", row_group_size=1000)
    assert compare_outputs(placement).identical
    changed = table.set_column(1, "kept", pa.array([i != 2345 for i in range(3000)]))
    pq.write_table(changed, b / "data/part-0.parquet", row_group_size=1000)
    (difference,) = compare_outputs(placement).differences
    assert difference.what == "record 2,345 differs: kept: true in the original, false in the rerun"


def test_run_records_are_left_out_and_paths_count_by_their_place(tmp_path):
    a, b, placement = _folders(tmp_path)
    for folder, stamp in ((a, "1"), (b, "2")):
        for name in (".executor_status", ".executor_info", ".attempts/001/replica-000.log", "tensorboard/events." + stamp,
                     "train.log", "checkpoints/4.corrupt-20260101T000000Z/state/x"):
            _write(folder, name, stamp)
        _write(folder, "index.json", json.dumps({"files": [str(folder / "part-0.txt")], "input": str(tmp_path / "in.txt")}))
    comparison = compare_outputs(placement)
    assert comparison.identical and comparison.files == 1
    assert ".executor_status" in comparison.left_out and "train.log" in comparison.left_out
    assert any(p.startswith(".attempts/") for p in comparison.left_out)
    assert any(p.startswith("tensorboard/") for p in comparison.left_out)
    # A path into the step's own folder counts by its place there; an input path must be the same.
    _write(b, "index.json", json.dumps({"files": [str(b / "part-0.txt")], "input": str(tmp_path / "other.txt")}))
    (difference,) = compare_outputs(placement).differences
    assert difference.what.startswith("input: ")


def test_arrays_are_compared_bit_for_bit_and_the_largest_difference_located():
    a = np.zeros((4, 5), np.float32)
    b = a.copy()
    b[1, 2], b[3, 4] = 1e-7, -0.5
    assert array_difference(a, b) == (
        "largest absolute difference 0.5 at index (3, 4) (0.0 in the original, -0.5 in the rerun); 2 of 20 elements differ"
    )
    assert array_difference(np.array([np.nan]), np.array([np.nan])) is None  # the same bits
    assert "1 of 1 elements differ" in array_difference(np.array([0.0]), np.array([-0.0]))
    assert array_difference(a, a.astype(np.float64)).startswith("stored (4, 5) float32 in the original")


def test_checkpoints_one_run_saved_by_the_clock_are_unpaired_but_the_newest_must_match(tmp_path):
    from levanter.trainer.checkpoint import Checkpointer

    a, b, placement = _folders(tmp_path)
    state = {"params": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.array(6, np.int32)}
    for folder, by_the_clock in ((a, 2), (b, 4)):
        writer = Checkpointer(str(folder / "checkpoints"), asynchronous=False, keep_last=None)
        writer.save(by_the_clock, {**state, "step": np.array(by_the_clock, np.int32)})
        writer.save(6, state)
        writer.close()
    comparison = compare_outputs(placement)
    assert comparison.identical and comparison.arrays == 2
    assert comparison.unpaired_checkpoints == ["checkpoints/2 (only in the original)", "checkpoints/4 (only in the rerun)"]

    writer = Checkpointer(str(b / "checkpoints"), asynchronous=False, keep_last=None)
    writer.save(7, state)
    writer.close()
    (difference,) = compare_outputs(placement).differences
    assert (difference.path, difference.what) == ("checkpoints/7", "only in the rerun (its newest checkpoint)")


# -- StepRunner(existing_outputs=...) ---------------------------------------------------------------


def _chain(calls: list[str]) -> tuple[StepSpec, StepSpec, StepSpec]:
    def first(output_path):
        calls.append("first")
        Path(output_path, "x").write_text("1")

    def second(ctx):
        calls.append("second")
        Path(ctx.output_path, "y").write_text(Path(ctx.dep_output_path("first"), "x").read_text() + "2")

    def third(ctx):
        calls.append("third")
        Path(ctx.output_path, "z").write_text(Path(ctx.dep_output_path("second"), "y").read_text() + "3")

    a = StepSpec("first", first)
    b = StepSpec("second", second, deps=[a])
    return a, b, StepSpec("third", third, deps=[b])


def test_existing_outputs_are_read_where_they_are_and_what_only_they_need_is_not_planned(tmp_path):
    calls: list[str] = []
    first, second, third = _chain(calls)
    original = StepRunner(prefix=str(tmp_path / "original"))
    original.run([third])
    finished = original.output_path_for(second)
    before = {p: os.stat(p).st_mtime_ns for p in Path(finished).rglob("*")}
    calls.clear()
    time.sleep(0.01)

    scratch = StepRunner(prefix=str(tmp_path / "scratch"), existing_outputs={second.identity: finished})
    assert [item.output_path for item in scratch.plan([third])] == [finished, scratch.output_path_for(third)]
    report = scratch.run([third])
    assert calls == ["third"] and report.cached == ["second"] and report.ran == ["third"]
    assert Path(scratch.output_path_for(third), "z").read_text() == "123"
    assert {p: os.stat(p).st_mtime_ns for p in Path(finished).rglob("*")} == before
    assert not Path(scratch.output_path_for(first)).exists()


def test_an_existing_output_that_is_not_finished_is_refused(tmp_path):
    first, second, third = _chain([])
    with pytest.raises(RunOptionError, match="was given as finished at .*missing"):
        StepRunner(prefix=str(tmp_path / "scratch"), existing_outputs={second.identity: str(tmp_path / "nowhere")}).run([third])
