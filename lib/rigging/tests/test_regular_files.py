"""``rigging.regular_files``: regular files only, never a wait on a FIFO, never more than the bound."""

from __future__ import annotations

import errno
import os
import socket
import threading

import pytest
from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError, check_within, open_regular, read_bounded, read_bounded_text

WAIT_S = 10.0


def _within_time(call):
    box = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    if thread.is_alive():
        return "blocked"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _release(fifo: str) -> None:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a reader still waiting (a regression) goes on
    except OSError as exc:
        assert exc.errno == errno.ENXIO


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    try:
        for read in (lambda: open_regular(fifo), lambda: read_bounded(fifo)):
            with pytest.raises(RefusedFileError, match=r"pipe is refused: not a regular file \(a FIFO\)$"):
                assert _within_time(read) != "blocked"
    finally:
        _release(fifo)


def test_devices_sockets_and_folders_are_refused_and_a_link_to_a_file_is_read(tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_bytes(b"data")
    os.symlink(tmp_path / "file", tmp_path / "alias")
    try:
        for name, kind in (("zero", "a character device"), ("sock", "a socket"), ("folder", "a folder")):
            with pytest.raises(RefusedFileError) as refused:
                read_bounded(str(tmp_path / name))
            assert refused.value.reason == f"not a regular file ({kind})"
    finally:
        server.close()
    assert read_bounded(str(tmp_path / "alias")) == b"data"
    assert read_bounded(str(tmp_path / "absent")) is None
    assert read_bounded(str(tmp_path / "file" / "below")) is None


def test_a_file_over_the_limit_is_refused_and_one_at_it_read_whole(tmp_path):
    path = tmp_path / "record.json"
    path.write_bytes(b"x" * 100)
    assert read_bounded(str(path), 100) == b"x" * 100
    with pytest.raises(RefusedFileError, match=r"larger than 99 bytes \(100 bytes\)$"):
        read_bounded(str(path), 99)
    fsx.atomic_write("memory://bounded/record.json", b"y" * 100)
    assert read_bounded_text("memory://bounded/record.json", 100) == "y" * 100
    with pytest.raises(RefusedFileError, match="larger than 99 bytes$"):
        read_bounded("memory://bounded/record.json", 99)
    assert read_bounded("memory://bounded/absent.json") is None


def test_within_refuses_files_and_folders_reached_through_a_link_out(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inside").mkdir(parents=True)
    outside.mkdir()
    (outside / "record.json").write_text("{}")
    (root / "inside" / "record.json").write_text("{}")
    os.symlink(outside, root / "folder-link")
    os.symlink(outside / "record.json", root / "file-link.json")
    os.symlink(root / "inside" / "record.json", root / "alias.json")
    for path in ("folder-link/record.json", "file-link.json"):
        with pytest.raises(RefusedFileError, match=f"a link to a place outside {root}$"):
            read_bounded(str(root / path), within=str(root))
    with pytest.raises(RefusedFileError):
        check_within(str(root), str(root / "folder-link"))
    assert read_bounded(str(root / "alias.json"), within=str(root)) == b"{}"
    assert read_bounded(str(root / "file-link.json")) == b"{}"  # without ``within``, links go anywhere
