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
