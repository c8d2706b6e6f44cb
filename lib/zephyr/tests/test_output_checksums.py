"""The checksum manifest of a finished step's folder: every reader refuses a recorded file that changed,
naming it; files no manifest records (hidden ones, unlisted ones, folders without one) read as before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rigging import filesystem as fsx
from zephyr import output_checksums
from zephyr.output_checksums import (
    MANIFEST_NAME,
    OutputChangedError,
    changed_files,
    read_checksums,
    recorded_checksum,
    write_checksums,
)
from zephyr.readers import read_documents, read_jsonl, read_parquet, read_text
from zephyr.writers import write_jsonl_file


def _folder(root: Path) -> Path:
    """A finished step's folder: a jsonl.zst, a Parquet and a text file (one nested), and hidden records."""
    root.mkdir()
    write_jsonl_file(str(root / "data" / "part-0.jsonl.zst"), [{"text": "a cat sat"}, {"text": "on a mat"}])
    pq.write_table(pa.table({"text": ["first row", "second row"]}), root / "rows.parquet")
    (root / "deep" / "er").mkdir(parents=True)
    (root / "deep" / "er" / "notes.txt").write_text("plain words")
    (root / ".artifact.json").write_text("{}")
    (root / ".attempts").mkdir()
    (root / ".attempts" / "001.log").write_text("log")
    write_checksums(str(root))
    return root


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def test_the_manifest_records_each_visible_file_with_its_size_and_sha256(tmp_path):
    root = _folder(tmp_path / "step")
    recorded = read_checksums(str(root))
    assert sorted(recorded) == ["data/part-0.jsonl.zst", "deep/er/notes.txt", "rows.parquet"]
    for name, entry in recorded.items():
        data = (root / name).read_bytes()
        assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert json.loads((root / MANIFEST_NAME).read_text())["algorithm"] == "sha256"
    assert recorded_checksum(str(root / "deep" / "er" / "notes.txt"))[0] == str(root / MANIFEST_NAME)
    assert recorded_checksum(str(root / ".attempts" / "001.log")) is None


@pytest.mark.parametrize(("name", "read", "at"), [
    ("deep/er/notes.txt", lambda path: list(read_text(path)), 2),
    ("rows.parquet", lambda path: list(read_parquet(path)), 60),
    ("data/part-0.jsonl.zst", lambda path: list(read_jsonl(path)), 14),
])
def test_every_reader_refuses_a_recorded_file_that_changed_naming_it(tmp_path, name, read, at):
    root = _folder(tmp_path / "step")
    path = root / name
    read(str(path))  # unchanged: reads
    _flip(path, at)
    with pytest.raises(OutputChangedError) as caught:
        read(str(path))
    assert str(caught.value).startswith(f"{path}: its sha256 is {hashlib.sha256(path.read_bytes()).hexdigest()} but the "
                                        "step recorded ")
    assert str(caught.value).endswith("when it committed; the output was changed after the step finished")
    assert [error.path for error in changed_files(str(root))] == [str(path)]


def test_a_truncated_file_is_named_by_its_size_even_where_reading_on_skips_damage(tmp_path):
    root = _folder(tmp_path / "step")
    path = root / "data" / "part-0.jsonl.zst"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(OutputChangedError, match="it holds .* bytes but the step recorded .* when it committed"):
        list(read_jsonl(str(path), on_error="skip"))


def test_unrecorded_files_and_folders_without_a_manifest_read_as_before(tmp_path):
    root = _folder(tmp_path / "step")
    (root / "added.txt").write_text("written after the commit")
    assert list(read_text(str(root / "added.txt"))) == ["written after the commit"]
    (root / MANIFEST_NAME).unlink()
    _flip(root / "deep" / "er" / "notes.txt", 2)
    assert list(read_documents(str(root / "deep"))) == ["plAin words"]
    assert changed_files(str(root)) is None


def test_a_missing_file_and_a_damaged_manifest_are_named(tmp_path):
    root = _folder(tmp_path / "step")
    (root / "rows.parquet").unlink()
    (missing,) = changed_files(str(root))
    assert str(missing) == (f"{root / 'rows.parquet'}: it is missing, but the step recorded it when it committed; "
                            "the output was changed after the step finished")
    (root / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(OutputChangedError, match=r"\.output_checksums\.json: the step's record of its output files cannot be read"):
        list(read_text(str(root / "deep" / "er" / "notes.txt")))


def test_folders_that_carry_their_own_checksums_are_left_out_of_the_manifest(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.jsonl").write_text('{"text": "a"}\n')
    shard = tmp_path / "cache" / "train" / "shard-00000"
    shard.mkdir(parents=True)
    (shard / "tokens.bin").write_bytes(b"\0" * 64)
    (shard / "shard.json").write_text("{}")
    checkpoint = tmp_path / "checkpoints" / "step-10"
    (checkpoint / "state").mkdir(parents=True)
    (checkpoint / "state" / "params").write_bytes(b"\1" * 64)
    (checkpoint / "checksums.json").write_text("{}")
    (tmp_path / "checkpoints" / "metrics.jsonl").write_text("{}\n")  # beside the marked folder: still recorded

    recorded = write_checksums(str(tmp_path), self_checked=("checksums.json", "shard.json"))

    assert sorted(recorded) == ["checkpoints/metrics.jsonl", "data/part-0.jsonl"]
    assert sorted(write_checksums(str(tmp_path))) == [
        "cache/train/shard-00000/shard.json", "cache/train/shard-00000/tokens.bin", "checkpoints/metrics.jsonl",
        "checkpoints/step-10/checksums.json", "checkpoints/step-10/state/params", "data/part-0.jsonl"]


def test_a_folder_with_no_file_to_record_gets_no_manifest(tmp_path):
    shard = tmp_path / "train" / "shard-00000"
    shard.mkdir(parents=True)
    (shard / "shard.json").write_text("{}")  # a folder checked by its own reader: nothing left to record
    (tmp_path / ".artifact.json").write_text("{}")  # hidden: never recorded

    assert write_checksums(str(tmp_path), self_checked=("shard.json",)) == {}

    assert not (tmp_path / MANIFEST_NAME).exists() and changed_files(str(tmp_path)) is None
    assert recorded_checksum(str(shard / "shard.json")) is None


def _counting_manifest_looks(monkeypatch, url: str) -> list[str]:
    """The manifest paths the store at ``url`` is asked about from now on, in order."""
    fs, _ = fsx.filesystem(url)
    asked: list[str] = []
    real_info = type(fs).info

    def info(self, path, **kwargs):
        if str(path).endswith(MANIFEST_NAME):
            asked.append(str(path))
        return real_info(self, path, **kwargs)

    monkeypatch.setattr(type(fs), "info", info)
    return asked


def test_on_an_object_store_each_folder_without_a_manifest_is_asked_about_once(monkeypatch):
    root = "memory://checksum-misses/raw/a/b"
    for i in range(3):
        write_jsonl_file(f"{root}/part-{i}.jsonl", [{"text": f"shard {i}"}])
    monkeypatch.setattr(output_checksums, "_absent", {})
    asked = _counting_manifest_looks(monkeypatch, root)
    assert list(read_jsonl(f"{root}/part-0.jsonl")) == [{"text": "shard 0"}]
    # Every folder above the shard, up to the store's top: each once.
    assert len(asked) == len(set(asked)) and asked[0].endswith(f"raw/a/b/{MANIFEST_NAME}") and len(asked) >= 4
    for i in (1, 2):
        assert list(read_jsonl(f"{root}/part-{i}.jsonl")) == [{"text": f"shard {i}"}]
    assert len(asked) == len(set(asked))  # not asked again for the other shards


def test_a_manifest_written_after_a_folder_was_seen_without_one_is_found(monkeypatch):
    monkeypatch.setattr(output_checksums, "_absent", {})
    root = "memory://checksum-late/step"
    write_jsonl_file(f"{root}/data/part-0.jsonl", [{"text": "a cat sat"}])
    assert list(read_jsonl(f"{root}/data/part-0.jsonl"))  # the folders are seen without a manifest
    write_checksums(root)  # a commit in this process
    fs, path = fsx.filesystem(f"{root}/data/part-0.jsonl")
    fs.pipe_file(path, b'{"text": "a cat sat!"}\n')
    with pytest.raises(OutputChangedError):
        list(read_jsonl(f"{root}/data/part-0.jsonl"))

    # A manifest another process writes is found once the remembered absence is ABSENT_KEPT_S old.
    other = "memory://checksum-other/step"
    write_jsonl_file(f"{other}/part-0.jsonl", [{"text": "a mat"}])
    now = [1000.0]
    monkeypatch.setattr(output_checksums, "_clock", lambda: now[0])
    assert list(read_jsonl(f"{other}/part-0.jsonl"))
    manifest = {"algorithm": "sha256", "files": {"part-0.jsonl": {"size": 1, "sha256": "0" * 64}}}
    fs.pipe_file(fsx.filesystem(f"{other}/{MANIFEST_NAME}")[1], json.dumps(manifest).encode())
    assert list(read_jsonl(f"{other}/part-0.jsonl"))  # still believed absent
    now[0] += output_checksums.ABSENT_KEPT_S
    with pytest.raises(OutputChangedError, match="it holds .* bytes but the step recorded 1 when it committed"):
        list(read_jsonl(f"{other}/part-0.jsonl"))
