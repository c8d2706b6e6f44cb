"""A fenced-off execution's processes are ended for certain (SIGTERM, then SIGKILL, bounded), never a
process that merely reuses a pid; and what a later execution takes over from it is only its
resumable state: checkpoints and finished token-cache shards by their own checksums, and what the
step declared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin.execution.ownership.ending_executions import end_replicas
from marin.execution.ownership.resumable_state import carry_over, declare_resumable, keep_only_resumable, resumable_entries
from marin.execution.ownership.step_ownership import heartbeat_url
from rigging.lease import ProcessIdentity

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process start times in /proc")


def _replica(ignores_sigterm: bool) -> subprocess.Popen:
    code = ("import signal, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignores_sigterm else "")
            + "print('ready', flush=True)\ntime.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def _heartbeat(step: Path, generation: int, replica: int, pid: int, started: str | None) -> None:
    me = ProcessIdentity.of_this_process()
    url = Path(heartbeat_url(str(step), generation, replica))
    url.parent.mkdir(parents=True, exist_ok=True)
    url.write_text(json.dumps({"generation": generation, "replica": replica, "host": me.host, "pid": pid,
                               "pid_started": started, "pid_namespace": me.namespace, "heartbeat_at": time.time(),
                               "ttl_s": 60, "ended": False}))


def _started(pid: int) -> str:
    """The process's start time as the kernel gives it (/proc/PID/stat field 22), as a heartbeat records it."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_replicas_are_asked_to_stop_then_killed_within_the_bound(tmp_path):
    polite, deaf = _replica(ignores_sigterm=False), _replica(ignores_sigterm=True)
    try:
        for index, child in enumerate((polite, deaf)):
            _heartbeat(tmp_path, 1, index, child.pid, _started(child.pid))
        started = time.monotonic()
        left = end_replicas(str(tmp_path), 1, grace_s=1.0, wait_s=20.0)
        assert left == [] and time.monotonic() - started < 15
        assert polite.wait(timeout=10) == -15  # SIGTERM was enough
        assert deaf.wait(timeout=10) == -9  # killed once the grace ran out
    finally:
        for child in (polite, deaf):
            if child.poll() is None:
                child.kill()


def test_a_process_that_only_reuses_the_pid_is_never_signalled(tmp_path):
    bystander = _replica(ignores_sigterm=False)
    try:
        # The heartbeat names this pid with another start time: the replica it describes is gone.
        _heartbeat(tmp_path, 1, 0, bystander.pid, "1")
        assert end_replicas(str(tmp_path), 1, grace_s=0.1, wait_s=1.0) == []
        time.sleep(0.3)
        assert bystander.poll() is None
    finally:
        bystander.kill()


def test_only_resumable_state_is_carried_over_and_kept(tmp_path):
    step = tmp_path / "step"
    old = step / ".staging" / "g1"  # as earlier versions named it: still carried over
    for name, text in {
        "checkpoints/20/checksums.json": "{}", "checkpoints/20/arrays/0.bin": "a",  # a checkpoint with its manifest
        "checkpoints/30/arrays/0.bin": "half",  # one cut short: no manifest
        "train/shard-00000/shard.json": "{}", "train/shard-00000/tokens.bin": "t",  # a finished shard
        "train/shard-00001/tokens.bin": "half",  # a half-written one
        "metrics.jsonl": "{}\n", "out.txt": "lines of the old execution\n", "tensorboard/events": "e",
    }.items():
        (old / name).parent.mkdir(parents=True, exist_ok=True)
        (old / name).write_text(text)
    os.symlink("out.txt", old / "latest")
    declare_resumable(str(old), ["metrics.jsonl"])
    assert resumable_entries(str(old)) == ["checkpoints/20", "metrics.jsonl", "train/shard-00000"]

    assert carry_over(str(step), ".staging/g1", ".staging-g2") == ["checkpoints/20", "metrics.jsonl", "train/shard-00000"]
    new = step / ".staging-g2"
    files = sorted(str(p.relative_to(new)) for p in new.rglob("*") if p.is_file())
    assert files == [".resumable.json", "checkpoints/20/arrays/0.bin", "checkpoints/20/checksums.json", "metrics.jsonl",
                     "train/shard-00000/shard.json", "train/shard-00000/tokens.bin"]
    assert (old / "out.txt").exists() and not (old / "checkpoints" / "20").exists()  # the rest stays behind, unread

    # Between two attempts of one execution: the same rule, in place.
    (new / "out.txt").write_text("the first attempt's\n")
    (new / "checkpoints" / "40").mkdir()
    (new / "checkpoints" / "40" / "partial.bin").write_text("p")
    assert sorted(keep_only_resumable(str(new))) == ["checkpoints/40/partial.bin", "out.txt"]
    assert (new / "checkpoints" / "20" / "checksums.json").exists() and (new / "metrics.jsonl").exists()


@pytest.mark.parametrize("name", ["../elsewhere", "/etc/passwd", "", "a/../../b"])
def test_a_declared_name_must_lie_inside_the_output(tmp_path, name):
    with pytest.raises(ValueError, match="inside the step's output"):
        declare_resumable(str(tmp_path), [name])
