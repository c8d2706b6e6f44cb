"""The web view's attempts and log windows: bounded reads, whole characters, running attempts, s3://."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient
from iris.attempt_log import AttemptLog, AttemptOutcome
from marin.serve.app import create_app
from marin.serve.attempts import read_window
from rigging import filesystem as fsx


def _step(prefix: str, relative: str, status: str) -> str:
    folder = fsx.join(prefix, relative)
    fsx.atomic_write(fsx.join(folder, ".executor_info"), json.dumps({"name": relative.rsplit("-", 1)[0],
                                                                     "identity": "ab12cd34" + "0" * 56}))
    fsx.atomic_write(fsx.join(folder, ".executor_status"), json.dumps({"status": status, "time": time.time()}))
    return folder


def test_windows_never_tear_a_character_and_join_back_into_the_log(tmp_path):
    text = "".join(f"{i} é 漢字 🙂\n" for i in range(300))
    path = tmp_path / "replica-000.log"
    path.write_bytes(text.encode("utf-8"))
    for limit in (7, 64, 1000):
        pieces, offset = [], 0
        while offset < len(text.encode()):
            window = read_window(str(path), offset=offset, limit=limit)
            assert window.end > offset and "\ufffd" not in window.text
            pieces.append(window.text)
            offset = window.end
        assert "".join(pieces) == text
        backwards, before = [], None
        while before != 0:
            window = read_window(str(path), before=before, limit=limit)
            assert "\ufffd" not in window.text and (before is None or window.end == before)
            backwards.insert(0, window.text)
            before = window.start
        assert "".join(backwards) == text


def test_a_running_attempt_is_followed_and_its_new_output_read_by_offset(tmp_path):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix, "train/x-ab12cd34", "RUNNING")
    attempt = AttemptLog.begin(folder)
    attempt.append(0, b"first line\n")
    client = TestClient(create_app(prefix), raise_server_exceptions=False)
    page = client.get("/log", params={"path": "train/x-ab12cd34", "attempt": 1}).text
    assert 'id="follow" checked' in page and "/api/log?" in page and "RUNNING" in page
    start = client.get("/api/log", params={"path": "train/x-ab12cd34", "attempt": 1}).json()
    assert start["text"] == "first line\n" and not start["finished"]
    attempt.append(0, b"second line\n")
    attempt.finish(AttemptOutcome.FAILED, "boom", [1])
    more = client.get("/api/log", params={"path": "train/x-ab12cd34", "attempt": 1, "offset": start["end"]}).json()
    assert more["text"] == "second line\n" and more["finished"] and more["outcome"] == "FAILED"
    step = client.get("/api/step", params={"path": "train/x-ab12cd34"}).json()
    assert [(a["outcome"], a["exit_codes"], a["reason"]) for a in step["attempts"]] == [("FAILED", [1], "boom")]


def test_attempt_logs_linked_out_of_the_prefix_are_refused(tmp_path):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix, "train/x-ab12cd34", "SUCCESS")
    elsewhere = tmp_path / "elsewhere"
    AttemptLog.begin(str(elsewhere)).append(0, b"not yours\n")
    os.symlink(elsewhere / ".attempts", os.path.join(folder, ".attempts"))
    client = TestClient(create_app(prefix), raise_server_exceptions=False)
    for route, params in (("/api/log", {"attempt": 1}), ("/log", {"attempt": 1}), ("/api/attempts", {}), ("/step", {})):
        response = client.get(route, params={"path": "train/x-ab12cd34", **params})
        assert response.status_code == 400 and "not yours" not in response.text, route


def test_attempts_and_logs_on_an_s3_prefix(s3_prefix):
    folder = _step(s3_prefix, "train/x-ab12cd34", "SUCCESS")
    attempt = AttemptLog.begin(folder, replicas=2, engine="slurm", job_id="job-7", job_attempt=1)
    attempt.append(1, b"from the bucket\n")
    attempt.finish(AttemptOutcome.SUCCEEDED, "", [0, 0])
    client = TestClient(create_app(s3_prefix), raise_server_exceptions=False)
    page = client.get("/step", params={"path": "train/x-ab12cd34"}).text
    assert 'data-attempt="1" data-outcome="SUCCEEDED"' in page and "job-7" in page
    log = client.get("/api/log", params={"path": "train/x-ab12cd34", "attempt": 1, "replica": 1}).json()
    assert log["text"] == "from the bucket\n" and log["finished"]


def test_the_attempts_table_names_each_replicas_engine_job(tmp_path):
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix, "train/x-ab12cd34", "RUNNING")
    attempt = AttemptLog.begin(folder, replicas=2, engine="slurm", job_id="train-x-job", job_attempt=1)
    attempt.placed(["4711", "4712"])  # what iris's supervisor records once the replicas hold their allocations
    client = TestClient(create_app(prefix), raise_server_exceptions=False)
    page = client.get("/step", params={"path": "train/x-ab12cd34"}).text
    assert '<td class="mono engine-job">4711, 4712</td>' in page and "<th>engine job</th>" in page
    attempt.finish(AttemptOutcome.SUCCEEDED, "", [0, 0])
    (row,) = client.get("/api/attempts", params={"path": "train/x-ab12cd34"}).json()["attempts"]
    assert row["engine_jobs"] == ["4711", "4712"] and row["outcome"] == "SUCCEEDED"  # kept when the attempt ends
