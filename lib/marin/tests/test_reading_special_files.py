"""What reads a prefix for a person (``marin serve``, ``marin status``, ``marin logs``) opens regular
files only, reads a bounded amount of each record, and (the web view) never leaves its prefix.

A FIFO, a device, an oversized record or a link out of the prefix in place of a data file, a record
or a log is shown as refused, naming the file and why, and everything else is still shown. Each
request or command runs in a thread joined with a timeout, so a regression fails instead of hanging
the suite; a FIFO left waiting is released at the end.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from iris.attempt_log import AttemptLog, AttemptOutcome
from marin.cli import main
from rigging import filesystem as fsx
from rigging.regular_files import RECORD_LIMIT_BYTES

ANSWER_S = 10.0
STEP = "train/x-ab12cd34"


def answered(request: Callable[[], Any]) -> Any:
    """``request()``'s result, failing the test when it has not answered within :data:`ANSWER_S`."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = request()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(ANSWER_S)
    assert not thread.is_alive(), f"no answer within {ANSWER_S} s: the request is blocked"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def fifos() -> Iterator[Callable[[str], str]]:
    """Makes FIFOs; afterwards, a reader still waiting on one (a regression) is let go."""
    made: list[str] = []

    def make(path: str) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for path in made:
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: nobody is waiting on it
            assert exc.errno in (errno.ENXIO, errno.ENOENT)
            continue
        os.close(descriptor)  # the waiting reader opens, then reads end-of-file


def _step(prefix: str, relative: str = STEP, status: str = "SUCCESS") -> str:
    folder = fsx.join(prefix, relative)
    fsx.atomic_write(fsx.join(folder, ".executor_info"), json.dumps({"name": relative.rsplit("-", 1)[0],
                                                                     "identity": "ab12cd34" + "0" * 56}))
    fsx.atomic_write(fsx.join(folder, ".executor_status"), json.dumps({"status": status, "time": time.time()}))
    return folder


def _client(prefix: str) -> Any:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient
    from marin.serve.app import create_app

    return TestClient(create_app(prefix), raise_server_exceptions=False)


# -- marin serve ----------------------------------------------------------------------------------


def test_a_fifo_data_file_is_refused_and_requests_go_on_being_answered(tmp_path, fifos):
    prefix = str(tmp_path / "prefix")
    fsx.atomic_write(fsx.join(prefix, "notes.txt"), "kept\n")
    fifos(os.path.join(prefix, "pipe.txt"))
    fifos(os.path.join(prefix, "pipe.jsonl"))
    client = _client(prefix)
    for path in ("pipe.txt", "pipe.jsonl", "pipe.txt"):
        response = answered(lambda path=path: client.get("/api/data", params={"path": path}))
        assert response.status_code == 422
        assert f"{path} is refused: not a regular file (a FIFO)" in response.json()["message"]
        page = answered(lambda path=path: client.get("/data", params={"path": path}))
        assert page.status_code == 422 and "not a regular file (a FIFO)" in page.text
    assert answered(lambda: client.get("/api/data", params={"path": "notes.txt"})).json()["rows"] == ["kept\n"]
    listing = answered(lambda: client.get("/api/data", params={"path": ""})).json()
    assert {entry["name"] for entry in listing["files"]} == {"notes.txt", "pipe.txt", "pipe.jsonl"}


def test_a_fifo_status_record_is_shown_refused_and_the_other_steps_listed(tmp_path, fifos):
    prefix = str(tmp_path / "prefix")
    _step(prefix, "data/fine-00000000")
    folder = _step(prefix)
    os.remove(os.path.join(folder, ".executor_status"))
    fifos(os.path.join(folder, ".executor_status"))
    client = _client(prefix)
    steps = answered(lambda: client.get("/api/steps")).json()["steps"]
    by_path = {row["path"]: row for row in steps}
    assert by_path["data/fine-00000000"]["status"] == "SUCCESS" and not by_path["data/fine-00000000"]["problems"]
    assert by_path[STEP]["status"] is None
    assert by_path[STEP]["problems"] == [f"{folder}/.executor_status is refused: not a regular file (a FIFO)"]
    home = answered(lambda: client.get("/"))
    assert home.status_code == 200 and "not a regular file (a FIFO)" in home.text and "data/fine-00000000" in home.text
    step = answered(lambda: client.get("/api/step", params={"path": STEP}))
    assert step.status_code == 200 and step.json()["step"]["problems"] == by_path[STEP]["problems"]
    assert answered(lambda: client.get("/runs")).status_code == 200


def test_an_info_record_linked_to_a_device_is_refused_and_the_list_still_answers(tmp_path):
    prefix = str(tmp_path / "prefix")
    _step(prefix, "data/fine-00000000")
    folder = _step(prefix)
    os.remove(os.path.join(folder, ".executor_info"))
    os.symlink("/dev/null", os.path.join(folder, ".executor_info"))
    client = _client(prefix)
    response = answered(lambda: client.get("/api/steps"))
    assert response.status_code == 200
    row = {row["path"]: row for row in response.json()["steps"]}[STEP]
    assert row["status"] == "SUCCESS" and row["record_damaged"]
    assert row["problems"] == [f"{folder}/.executor_info is refused: a link to a place outside {prefix}"]
    assert "a link to a place outside" in answered(lambda: client.get("/")).text
    step = answered(lambda: client.get("/step", params={"path": STEP}))
    assert step.status_code == 422 and ".executor_info is refused" in step.text


def test_a_record_larger_than_the_limit_is_refused_unread(tmp_path):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix)
    with open(os.path.join(folder, ".executor_status"), "wb") as handle:
        handle.truncate(RECORD_LIMIT_BYTES + 1)  # sparse: costs no disk
    row = _client(prefix).get("/api/steps").json()["steps"][0]
    assert row["problems"] == [f"{folder}/.executor_status is refused: larger than {RECORD_LIMIT_BYTES} bytes "
                               f"({RECORD_LIMIT_BYTES + 1} bytes)"]


def test_an_attempt_record_linked_to_a_device_is_refused_and_the_step_page_answers(tmp_path):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix)
    first = AttemptLog.begin(folder)
    first.finish(AttemptOutcome.PREEMPTED, "", [75])
    second = AttemptLog.begin(folder)
    second.append(0, b"second\n")
    second.finish(AttemptOutcome.SUCCEEDED, "", [0])
    record = os.path.join(folder, ".attempts", "001", "attempt.json")
    os.remove(record)
    os.symlink("/dev/null", record)
    client = _client(prefix)
    attempts = answered(lambda: client.get("/api/attempts", params={"path": STEP})).json()["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "UNREADABLE"), (2, "SUCCEEDED")]
    assert attempts[0]["description"] == (f"attempt 1: no readable attempt.json ({folder}/.attempts/001/attempt.json "
                                          f"is refused: a link to a place outside {prefix})")
    page = answered(lambda: client.get("/step", params={"path": STEP}))
    assert page.status_code == 200 and "a link to a place outside" in page.text


def test_an_attempt_folder_linked_out_of_the_prefix_is_not_read(tmp_path):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix)
    AttemptLog.begin(folder).finish(AttemptOutcome.SUCCEEDED, "", [0])
    elsewhere = tmp_path / "elsewhere"
    theirs = AttemptLog.begin(str(elsewhere), engine="engine-outside-the-prefix")
    theirs.append(0, b"not yours\n")
    theirs.finish(AttemptOutcome.FAILED, "secret reason", [1])
    os.symlink(elsewhere / ".attempts" / "001", os.path.join(folder, ".attempts", "002"))
    client = _client(prefix)
    response = client.get("/api/attempts", params={"path": STEP})
    assert response.status_code == 200
    assert "engine-outside-the-prefix" not in response.text and "secret reason" not in response.text
    attempts = response.json()["attempts"]
    assert [(a["attempt"], a["outcome"], a["replicas"]) for a in attempts] == [(1, "SUCCEEDED", [0]), (2, "UNREADABLE", [])]
    assert f"{folder}/.attempts/002 is refused: a link to a place outside {prefix}" in attempts[1]["description"]
    log = client.get("/api/log", params={"path": STEP, "attempt": 2})
    assert log.status_code == 400 and "not yours" not in log.text


def test_a_fifo_replica_log_is_refused_and_the_attempts_still_listed(tmp_path, fifos):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix)
    attempt = AttemptLog.begin(folder, replicas=2)
    attempt.append(1, b"replica one\n")
    attempt.finish(AttemptOutcome.SUCCEEDED, "", [0, 0])
    log = os.path.join(folder, ".attempts", "001", "replica-000.log")
    os.remove(log)
    fifos(log)
    client = _client(prefix)
    for route in ("/api/log", "/log"):
        response = answered(lambda route=route: client.get(route, params={"path": STEP, "attempt": 1}))
        assert response.status_code == 422 and "replica-000.log is refused: not a regular file (a FIFO)" in response.text
    other = answered(lambda: client.get("/api/log", params={"path": STEP, "attempt": 1, "replica": 1})).json()
    assert other["text"] == "replica one\n"
    attempts = answered(lambda: client.get("/api/attempts", params={"path": STEP})).json()["attempts"]
    assert attempts[0]["outcome"] == "SUCCEEDED" and attempts[0]["replicas"] == [0, 1]


# -- marin status and marin logs ------------------------------------------------------------------


def test_status_shows_a_fifo_status_record_as_refused_and_lists_the_other_steps(tmp_path, fifos, capsys):
    prefix = str(tmp_path / "prefix")
    _step(prefix, "data/fine-00000000")
    folder = _step(prefix)
    os.remove(os.path.join(folder, ".executor_status"))
    fifos(os.path.join(folder, ".executor_status"))
    assert answered(lambda: main(["status", "--prefix", prefix])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("SUCCESS") and "data/fine" in lines[1]
    assert lines[2].startswith("-") and f"({folder}/.executor_status is refused: not a regular file (a FIFO))" in lines[2]
    assert answered(lambda: main(["status", "--json", "--prefix", prefix])) == 0
    listed = {step["output_path"]: step for step in json.loads(capsys.readouterr().out)}
    assert listed[folder]["problems"] == [f"{folder}/.executor_status is refused: not a regular file (a FIFO)"]


def test_status_refuses_records_that_are_devices_or_too_large(tmp_path, capsys):
    prefix = str(tmp_path / "prefix")
    device_folder, large_folder = _step(prefix, "a/device-00000000"), _step(prefix, "b/large-00000000")
    os.remove(os.path.join(device_folder, ".executor_info"))
    os.symlink("/dev/null", os.path.join(device_folder, ".executor_info"))
    with open(os.path.join(large_folder, ".executor_status"), "wb") as handle:
        handle.truncate(RECORD_LIMIT_BYTES + 1)
    assert answered(lambda: main(["status", "--json", "--prefix", prefix])) == 0
    listed = {step["output_path"]: step for step in json.loads(capsys.readouterr().out)}
    assert listed[device_folder]["problems"] == [f"{device_folder}/.executor_info is refused: not a regular file "
                                                 "(a character device)"]
    assert listed[device_folder]["status"] == "SUCCESS"
    assert listed[large_folder]["problems"] == [f"{large_folder}/.executor_status is refused: larger than "
                                                f"{RECORD_LIMIT_BYTES} bytes ({RECORD_LIMIT_BYTES + 1} bytes)"]


def test_logs_refuses_an_attempt_record_that_is_a_device_and_prints_the_rest(tmp_path, capsys):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix)
    first = AttemptLog.begin(folder)
    first.append(0, b"first\n")
    first.finish(AttemptOutcome.PREEMPTED, "", [75])
    second = AttemptLog.begin(folder)
    second.append(0, b"second\n")
    second.finish(AttemptOutcome.SUCCEEDED, "", [0])
    record = os.path.join(folder, ".attempts", "001", "attempt.json")
    os.remove(record)
    os.symlink("/dev/null", record)
    assert answered(lambda: main(["logs", "train/x", "--prefix", prefix])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"=== attempt 1: no readable attempt.json ({record} is refused: not a regular file "
                         "(a character device))", "first"]
    assert lines[2].startswith("=== attempt 2 (local): SUCCEEDED") and lines[3] == "second"
    assert answered(lambda: main(["logs", "train/x", "--prefix", prefix, "--json"])) == 0
    listing = json.loads(capsys.readouterr().out)
    assert "not a regular file (a character device)" in listing["attempts"][0]["problem"]


def test_logs_refuses_a_fifo_replica_log_and_prints_the_other_replicas(tmp_path, fifos, capsys):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix)
    attempt = AttemptLog.begin(folder, replicas=2)
    attempt.append(1, b"replica one\n")
    attempt.finish(AttemptOutcome.SUCCEEDED, "", [0, 0])
    log = os.path.join(folder, ".attempts", "001", "replica-000.log")
    os.remove(log)
    fifos(log)
    assert answered(lambda: main(["logs", "train/x", "--prefix", prefix])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"--- replica 0: {log} is refused: not a regular file (a FIFO)", "--- replica 1", "replica one"]


def test_a_fifo_metrics_file_is_shown_refused_and_the_other_runs_are_charted(tmp_path, fifos):
    prefix = str(tmp_path / "prefix")
    good = _step(prefix, "checkpoints/good-00000000")
    fsx.atomic_write(fsx.join(good, "metrics.jsonl"), json.dumps({"step": 1, "loss": 2.5}) + "\n")
    bad = _step(prefix)
    fifos(os.path.join(bad, "metrics.jsonl"))
    client = _client(prefix)
    page = answered(lambda: client.get("/runs", params={"run": ["checkpoints/good-00000000", STEP]}))
    assert page.status_code == 200
    assert f"{bad}/metrics.jsonl is refused: not a regular file (a FIFO)" in page.text
    assert "Not charted: " in page.text and "good" in page.text and "2.5" in page.text


def test_comparing_versions_follows_no_record_out_of_the_prefix(tmp_path):
    prefix, outside = tmp_path / "prefix", tmp_path / "outside"

    def record(folder, identity: str, attrs: dict, deps: list) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".executor_info").write_text(json.dumps({"name": folder.name.rsplit("-", 1)[0], "identity": identity,
                                                           "version": "v1", "hash_attrs": attrs, "deps": deps}))
        (folder / ".executor_status").write_text(json.dumps({"status": "SUCCESS", "time": time.time()}))

    record(outside / "data-aaaaaaaa", "a" * 64, {"secret_setting": "outside-a"}, [])
    record(outside / "data-bbbbbbbb", "b" * 64, {"secret_setting": "outside-b"}, [])
    for short, dep in (("11111111", "data-aaaaaaaa"), ("22222222", "data-bbbbbbbb")):
        record(prefix / "train" / f"run-{short}", short * 8, {"lr": short},
               [{"name": "data", "identity": dep[-8:] * 8, "output_path": str(outside / dep)}])
    client = _client(str(prefix))

    answer = answered(lambda: client.get("/api/step", params={"path": "train/run-11111111", "compare": "train/run-22222222"}))
    differences = answer.json()["differences"]
    assert any("hash_attrs.lr changed" in line for line in differences)
    assert any("-> data: identity changed aaaaaaaa -> bbbbbbbb" in line for line in differences)
    assert not any("outside-" in line for line in differences), differences

    os.symlink(outside / "data-bbbbbbbb", prefix / "train" / "run-33333333")
    linked = answered(lambda: client.get("/api/step", params={"path": "train/run-11111111", "compare": "train/run-33333333"}))
    assert linked.status_code in (400, 422) and "outside" in linked.json()["message"], linked.json()
    assert "outside-b" not in linked.text
