"""``marin logs``: a step's attempts and their replicas' output, from local and s3:// prefixes."""

from __future__ import annotations

import json
import threading
import time

import pytest
from iris.attempt_log import AttemptLog, AttemptOutcome
from marin.cli import main
from marin.execution.command_line import step_logs
from rigging import filesystem as fsx

WAIT_S = 30


def _step(prefix: str, relative: str, status: str = "SUCCESS") -> str:
    folder = fsx.join(prefix, relative)
    name = relative.rsplit("-", 1)[0]
    fsx.atomic_write(fsx.join(folder, ".executor_info"), json.dumps({"name": name, "identity": "ab12cd34" + "0" * 56}))
    _set_status(folder, status)
    return folder


def _set_status(folder: str, status: str) -> None:
    fsx.atomic_write(fsx.join(folder, ".executor_status"), json.dumps({"status": status, "time": time.time()}))


def _two_attempts(folder: str) -> None:
    first = AttemptLog.begin(folder, replicas=2, engine="ray", job_id="train-x-1", job_attempt=1)
    first.append(0, b"zero says hi\n")
    first.append(1, b"one says hi\n")
    first.finish(AttemptOutcome.PREEMPTED, "spot instance reclaimed", [75, None])
    second = AttemptLog.begin(folder)
    second.append(0, b"all done\n")
    second.finish(AttemptOutcome.SUCCEEDED, "", [0])


def test_logs_prints_every_attempt_then_its_replicas(tmp_path, capsys):
    prefix = str(tmp_path / "prefix")
    _two_attempts(_step(prefix, "train/x-ab12cd34"))
    assert main(["logs", "train/x", "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert out == (
        "=== attempt 1 (iris job train-x-1, its attempt 1, on ray): PREEMPTED (exit 75, ?) after "
        + out.split("after ", 1)[1].split("\n", 1)[0] + "\n"
        "--- replica 0\nzero says hi\n--- replica 1\none says hi\n"
        "=== attempt 2 (local): SUCCEEDED (exit 0) after " + out.rsplit("after ", 1)[1].split("\n", 1)[0] + "\n"
        "all done\n"
    )
    assert "spot instance reclaimed" in out.split("\n", 1)[0]

    assert main(["logs", "train/x-ab12cd34", "--prefix", prefix, "--attempt", "2"]) == 0
    assert capsys.readouterr().out.split("\n")[1:] == ["all done", ""]
    assert main(["logs", "train/x", "--prefix", prefix, "--attempt", "5"]) == 2
    assert "no attempt 5 (attempts: 1, 2)" in capsys.readouterr().err

    assert main(["logs", str(tmp_path / "prefix" / "train" / "x-ab12cd34"), "--prefix", prefix, "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [a["record"]["outcome"] for a in listing["attempts"]] == ["PREEMPTED", "SUCCEEDED"]
    assert listing["status"] == "SUCCESS" and list(listing["attempts"][1]["log_bytes"].values()) == [len(b"all done\n")]


def test_a_step_without_attempts_says_so_and_an_unknown_one_names_the_closest(tmp_path, capsys):
    prefix = str(tmp_path / "prefix")
    _step(prefix, "tokenized/stories-ab12cd34")
    assert main(["logs", "tokenized/stories", "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no attempts recorded" in out
    assert main(["logs", "tokenized/storys", "--prefix", prefix]) == 2
    err = capsys.readouterr().err
    assert "no step output found for 'tokenized/storys'" in err and "closest: tokenized/stories" in err


def test_follow_prints_output_as_it_arrives_and_attempts_that_start_meanwhile(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(step_logs, "POLL_S", 0.02)
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix, "train/x-ab12cd34", status="RUNNING")
    first = AttemptLog.begin(folder)
    first.append(0, b"before following\n")
    printed = []

    def follow():
        printed.append(main(["logs", "train/x", "--prefix", prefix, "--follow"]))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    for i in range(5):
        first.append(0, f"tick {i}\n".encode())
        time.sleep(0.03)
    first.finish(AttemptOutcome.PREEMPTED, "preempted", [75])
    time.sleep(0.1)  # the step is still RUNNING: the follower must wait for the next attempt
    assert follower.is_alive()
    second = AttemptLog.begin(folder)
    second.append(0, b"second attempt\n")
    second.finish(AttemptOutcome.SUCCEEDED, "", [0])
    _set_status(folder, "SUCCESS")
    follower.join(timeout=WAIT_S)
    assert not follower.is_alive() and printed == [0]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("=== attempt 1 (local): RUNNING")
    assert lines[1:7] == ["before following", "tick 0", "tick 1", "tick 2", "tick 3", "tick 4"]
    assert lines[7].startswith("=== attempt 1 (local): PREEMPTED (exit 75)")  # how the followed attempt ended
    assert lines[8].startswith("=== attempt 2 (local): ") and lines[9] == "second attempt"
    # Seen already ended, its header says so; seen running, its end is printed after its output.
    ends = [line for line in lines[8:] if line.startswith("=== attempt 2 (local): SUCCEEDED")]
    assert len(ends) == 1 and lines[8:] in (ends + ["second attempt"], [lines[8], "second attempt"] + ends)


def test_following_one_attempt_stops_when_it_ends_though_the_step_runs_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(step_logs, "POLL_S", 0.02)
    prefix = str(tmp_path / "prefix")
    folder = _step(prefix, "train/x-ab12cd34", status="RUNNING")
    first = AttemptLog.begin(folder)
    first.finish(AttemptOutcome.PREEMPTED, "", [75])
    AttemptLog.begin(folder).append(0, b"the second attempt runs on\n")
    codes = []
    follower = threading.Thread(target=lambda: codes.append(main(["logs", "train/x", "--prefix", prefix, "--follow",
                                                                  "--attempt", "1"])), daemon=True)
    follower.start()
    follower.join(timeout=WAIT_S)
    assert not follower.is_alive() and codes == [0]
    out = capsys.readouterr().out
    assert "PREEMPTED" in out and "second attempt" not in out


def test_follow_ends_quietly_with_130_on_ctrl_c(tmp_path, capsys, monkeypatch):
    prefix = str(tmp_path / "prefix")
    AttemptLog.begin(_step(prefix, "train/x-ab12cd34", status="RUNNING")).append(0, b"running\n")

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(step_logs.time, "sleep", interrupted)
    assert main(["logs", "train/x", "--prefix", prefix, "--follow"]) == 130
    captured = capsys.readouterr()
    assert "running" in captured.out and "Traceback" not in captured.err + captured.out


def test_logs_reads_attempts_on_an_s3_prefix(s3_prefix, capsys):
    _two_attempts(_step(s3_prefix, "train/x-ab12cd34"))
    assert main(["logs", "train/x", "--prefix", s3_prefix, "--attempt", "1"]) == 0
    out = capsys.readouterr().out
    assert "--- replica 0\nzero says hi\n--- replica 1\none says hi\n" in out and "PREEMPTED" in out


KILLED_RUNNER = """
import sys, time
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

def sleeper():
    print("sleeping", flush=True)
    time.sleep(300)

StepRunner(prefix=sys.argv[1], lease_ttl_s=3, heartbeat_s=0.5).run([StepSpec("sleeper", sleeper)])
"""


def _logged(prefix, text: str) -> bool:
    """Whether the sleeper's first attempt has logged ``text``."""
    return any(text in log.read_text(errors="replace") for log in prefix.glob("sleeper-*/.attempts/001/*.log"))


def test_follow_stops_on_a_step_whose_runner_was_killed(tmp_path, capsys, monkeypatch):
    import subprocess
    import sys

    prefix = str(tmp_path / "prefix")
    script = tmp_path / "runner.py"
    script.write_text(KILLED_RUNNER)
    runner = subprocess.Popen([sys.executable, str(script), prefix], cwd=tmp_path)
    try:
        # Killed once the step's function has printed: the attempt's log exists a moment before that.
        deadline = time.monotonic() + 60
        while not _logged(tmp_path / "prefix", "sleeping") and time.monotonic() < deadline:
            assert runner.poll() is None
            time.sleep(0.05)
    finally:
        runner.kill()
        runner.wait(timeout=30)
    monkeypatch.setattr(step_logs, "ORPHAN_GRACE_S", 0.5)
    monkeypatch.setattr(step_logs, "POLL_S", 0.05)
    printed: list[int] = []
    follower = threading.Thread(target=lambda: printed.append(main(["logs", "sleeper", "--prefix", prefix, "--follow"])),
                                daemon=True)
    follower.start()
    follower.join(timeout=WAIT_S)
    assert not follower.is_alive(), "marin logs --follow kept waiting on a step nothing runs"
    captured = capsys.readouterr()
    assert printed == [0] and "sleeping" in captured.out
    assert "no runner holds it and no replica heartbeats" in captured.err
