import os

import pytest

from rigging import conditional_writes
from rigging import filesystem as fsx


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    if request.param == "local":
        yield str(tmp_path)
        return
    url = f"memory://rigging-fs-{os.getpid()}-{id(request)}"
    yield url
    fsx.rm(url, recursive=True)


def test_atomic_write_roundtrip_and_listing(root):
    target = fsx.join(root, "a", "b.txt")
    fsx.atomic_write(target, "hello")
    assert fsx.exists(target)
    assert fsx.read_text(target) == "hello"
    fsx.atomic_write(target, b"bytes")
    with fsx.open_url(target, "rb") as handle:
        assert handle.read() == b"bytes"
    assert [p.rstrip("/").rsplit("/", 1)[-1] for p in fsx.ls(fsx.join(root, "a"))] == ["b.txt"]
    fsx.rm(target)
    assert not fsx.exists(target)
    assert fsx.read_text(target) is None


def test_atomic_open_leaves_old_content_when_block_fails(root):
    target = fsx.join(root, "c.txt")
    fsx.atomic_write(target, "old")
    with pytest.raises(RuntimeError):
        with fsx.atomic_open(target, "w") as handle:
            handle.write("half of the new")
            raise RuntimeError("crash mid-write")
    assert fsx.read_text(target) == "old"
    if "://" not in root:
        assert sorted(os.listdir(root)) == ["c.txt"]  # no temporary files left behind


def test_create_exclusive_only_once(root):
    target = fsx.join(root, "lock")
    assert conditional_writes.create_exclusive(target, "first")
    assert not conditional_writes.create_exclusive(target, "second")
    assert fsx.read_text(target) == "first"


def test_join_keeps_url_slashes():
    assert fsx.join("gs://bucket/prefix/", "a", "b") == "gs://bucket/prefix/a/b"
    assert fsx.join("/tmp/x", "/abs") == "/abs"


@pytest.mark.parametrize("path", ["/a/b", "/a/b/", "/a//b", "/", "//x", "/a/./b", "/a/../b", "/a:b", "/a b/c~"])
def test_a_plain_absolute_path_resolves_as_fsspec_resolves_it(path):
    import fsspec

    fs, inside = fsx.filesystem(path)
    expected_fs, expected = fsspec.core.url_to_fs(path)
    assert type(fs) is type(expected_fs) and inside == expected


def test_remove_empty_folder_removes_only_an_empty_local_folder(tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "file").write_text("x")
    assert fsx.remove_empty_folder(str(empty)) and not empty.exists()
    assert fsx.remove_empty_folder(str(empty))  # already gone: nothing left to remove
    assert not fsx.remove_empty_folder(str(full)) and (full / "file").exists()
    assert not fsx.remove_empty_folder("memory://some/folder")  # no folders to remove on a store
