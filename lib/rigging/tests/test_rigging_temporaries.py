"""One temporary-name rule for every atomic write, and the listing/deleting helpers built on it."""

import os

import fsspec

from rigging import conditional_writes
from rigging import filesystem as fsx


def test_temporary_names_are_hidden_random_siblings():
    first, second = fsx.temporary_name_for("/data/run/metrics.json"), fsx.temporary_name_for("/data/run/metrics.json")
    assert first != second
    assert first.startswith("/data/run/.metrics.json.tmp-")
    assert fsx.temporary_name_for("gs://bucket/x/shard.bin").startswith("gs://bucket/x/.shard.bin.tmp-")
    assert fsx.is_temporary_name(first) and fsx.is_temporary_name(os.path.basename(second))
    for ordinary in ("metrics.json", "notes.tmp-keep", "shard.bin.tmp-0123456789ab", ".hidden", ".x.tmp-0123456789abc"):
        assert not fsx.is_temporary_name(ordinary), ordinary


def test_atomic_open_and_create_exclusive_write_through_a_recognised_temporary(tmp_path, monkeypatch):
    seen = []
    real_replace, real_link = os.replace, os.link

    def spy_replace(src, dst):
        seen.append(os.path.basename(src))
        return real_replace(src, dst)

    def spy_link(src, dst):
        seen.append(os.path.basename(src))
        return real_link(src, dst)

    monkeypatch.setattr(os, "replace", spy_replace)
    monkeypatch.setattr(os, "link", spy_link)
    with fsx.atomic_open(str(tmp_path / "a.json"), "w") as handle:
        # While the block runs, the only file in the folder is the temporary.
        in_progress = os.listdir(tmp_path)
        handle.write("{}")
    assert conditional_writes.create_exclusive(str(tmp_path / "lock"), "held")
    assert len(in_progress) == 1 and fsx.is_temporary_name(in_progress[0])
    assert len(seen) == 2 and all(fsx.is_temporary_name(name) for name in seen)
    assert sorted(os.listdir(tmp_path)) == ["a.json", "lock"]


def test_find_files_and_remove_files_use_one_listing_relative_to_the_folder():
    fs = fsspec.filesystem("memory")
    fs.pipe("/rigging-temporaries/keep.txt", b"k")
    fs.pipe("/rigging-temporaries/sub/.part.tmp-0123456789ab", b"t")
    assert fsx.find_files("memory://rigging-temporaries") == ["keep.txt", "sub/.part.tmp-0123456789ab"]
    assert fsx.find_files("memory://rigging-temporaries-missing") == []
    fsx.remove_files("memory://rigging-temporaries", ["sub/.part.tmp-0123456789ab"])
    assert fsx.find_files("memory://rigging-temporaries") == ["keep.txt"]


def test_find_files_on_local_disk_lists_what_fsspec_lists(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "keep.txt").write_text("k")
    (tmp_path / "sub" / "deeper" / "x.bin").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    os.symlink("/tmp", tmp_path / "outside")  # a link to a folder: listed, never followed
    os.symlink("loop", tmp_path / "loop")  # a link to itself
    expected = sorted(name[len(str(tmp_path)) + 1:] for name in fsspec.filesystem("file").find(str(tmp_path)))
    assert fsx.find_files(str(tmp_path)) == expected == ["keep.txt", "loop", "outside", "sub/deeper/x.bin"]
    assert fsx.find_files(str(tmp_path / "missing")) == [] and fsx.find_files(str(tmp_path / "keep.txt")) == []


def test_local_atomic_writes_make_missing_folders_and_leave_no_temporary(tmp_path):
    target = tmp_path / "a" / "b" / "record.json"
    fsx.atomic_write(str(target), "first")
    fsx.atomic_write(str(target), b"second", durable=False)
    assert target.read_bytes() == b"second" and os.listdir(target.parent) == ["record.json"]
    big = os.urandom(3 * (1 << 16) + 5)  # more than one read's worth
    fsx.atomic_write(str(target), big)
    assert fsx.read_local_bytes(str(target)) == big
