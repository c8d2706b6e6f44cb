"""Exactly once through iris when processes die: each kill leaves one execution's output in the step folder.

The step appends its pid to ``lines.txt`` in the folder it is given, every 50 ms, until the test
releases it. Two executions writing the step's output at once would show as interleaved pids in
the committed file; a step run twice, as a second ``started-*`` marker or a second iris job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iris import JobStore
from marin.execution.records.executor_files import read_status

RUNNER = textwrap.dedent(
    """
    import os, pathlib, sys, time
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def appender(ctx):
        marker = pathlib.Path(os.environ["MARIN_TEST_MARKERS"])
        marker.mkdir(exist_ok=True)
        (marker / f"started-{time.time_ns()}-{os.getpid()}").write_text(ctx.output_path)
        lines = os.path.join(ctx.output_path, "lines.txt")
        deadline = time.time() + float(os.environ["MARIN_TEST_SECONDS"])
        with open(lines, "a") as handle:
            while time.time() < deadline and not (marker / "release").exists():
                if os.environ.get("MARIN_TEST_IGNORES_FENCE") != "1":
                    ctx.check_lease()  # raises once this execution is stopped or fenced off
                handle.write(f"{os.getpid()}\\n")
                handle.flush()
                time.sleep(0.05)
        return {"lines": lines, "pid": os.getpid()}

    if __name__ == "__main__":
        report = StepRunner(prefix=sys.argv[1], cluster="iris:local", lease_ttl_s=3, heartbeat_s=0.5).run(
            [StepSpec("appender", appender)])
        outcome = report.outcome_of("appender")
        print(f"OUTCOME {outcome.outcome.name} {outcome.result}", flush=True)
        sys.exit(0 if outcome.outcome.name in ("RAN", "CACHED") else 1)
    """
)


def _start(tmp_path: Path, *, iris_home: str = "iris-home", seconds: float = 120, ignores_fence: bool = False) -> subprocess.Popen:
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {**os.environ, "IRIS_HOME": str(tmp_path / iris_home), "MARIN_TEST_MARKERS": str(tmp_path / "markers"),
           "MARIN_TEST_SECONDS": str(seconds), "MARIN_TEST_IGNORES_FENCE": "1" if ignores_fence else "0"}
    return subprocess.Popen([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "prefix")], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _starts(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "markers"
    return sorted(folder.glob("started-*")) if folder.exists() else []


def _wait_until(condition, what: str, timeout: float = 60, runner: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if runner is not None and runner.poll() is not None:
            pytest.fail(f"the runner exited ({runner.returncode}) before {what}: {runner.stderr.read()[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting until {what}")


def _step_folder(tmp_path: Path) -> Path:
    (folder,) = [p for p in (tmp_path / "prefix").iterdir() if p.is_dir() and p.name.startswith("appender")]
    return folder


def _replica_pid(marker: Path) -> int:
    return int(marker.name.rsplit("-", 1)[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


def _writers(lines: Path) -> list[int]:
    """The pids that wrote ``lines``, in the order their runs of lines appear (a pid twice: interleaved)."""
    runs: list[int] = []
    for line in lines.read_text().split():
        pid = int(line)
        if not runs or runs[-1] != pid:
            runs.append(pid)
    return runs


def _start_then_kill_the_runner(tmp_path: Path, *, with_supervisor: bool = False) -> Path:
    """Start a runner, SIGKILL it (and its job's supervisor) once the step runs; the step's folder."""
    first = _start(tmp_path)
    _wait_until(lambda: len(_starts(tmp_path)) == 1, "the step started", runner=first)
    (job,) = JobStore(tmp_path / "iris-home").all()
    first.kill()
    if with_supervisor:
        os.kill(job.supervisor_pid, signal.SIGKILL)
    first.communicate(timeout=30)
    return _step_folder(tmp_path)


def _lock_holder(folder: Path) -> str | None:
    try:
        return json.loads((folder / ".executor_lock").read_text()).get("holder")
    except (OSError, ValueError):
        return None


def _finish(runner: subprocess.Popen, tmp_path: Path) -> str:
    (tmp_path / "markers").mkdir(exist_ok=True)
    (tmp_path / "markers" / "release").touch()
    stdout, stderr = runner.communicate(timeout=180)
    assert runner.returncode == 0, (stdout + stderr)[-4000:]
    return stdout + stderr


def test_a_killed_supervisor_fences_off_its_replica_and_the_rerun_never_runs_beside_it(tmp_path):
    first = _start(tmp_path)
    _wait_until(lambda: len(_starts(tmp_path)) == 1, "the step started", runner=first)
    orphan = _replica_pid(_starts(tmp_path)[0])
    (job,) = JobStore(tmp_path / "iris-home").all()
    os.kill(job.supervisor_pid, signal.SIGKILL)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode != 0 and "supervisor" in stderr, stderr[-3000:]
    # The runner ended the execution in the step's record: its replica sees it and stops by itself.
    _wait_until(lambda: not _alive(orphan), "the orphan replica stopped", timeout=30)
    folder = _step_folder(tmp_path)
    assert read_status(str(folder)).status == "FAILED"
    second = _start(tmp_path)
    _wait_until(lambda: len(_starts(tmp_path)) == 2, "the step started again", runner=second)
    log = _finish(second, tmp_path)
    status = read_status(str(folder))
    assert status.status == "SUCCESS" and status.generation == 2
    writers = _writers(folder / "lines.txt")
    # The second execution started from a clean folder: what the fenced-off one wrote is not continued.
    assert writers == [_replica_pid(_starts(tmp_path)[1])], writers
    assert "g2 starts from a clean folder (g1 left no resumable state" in log


def test_a_fenced_off_replica_that_never_looks_at_the_fence_is_ended_and_nothing_of_it_is_committed(tmp_path):
    # The step never calls ctx.check_lease(): only ending its process stops it.
    first = _start(tmp_path, seconds=60, ignores_fence=True)
    _wait_until(lambda: len(_starts(tmp_path)) == 1, "the step started", runner=first)
    orphan = _replica_pid(_starts(tmp_path)[0])
    folder = _step_folder(tmp_path)
    _wait_until(lambda: len(list((folder / ".staging-g1").glob("lines.txt"))) == 1
                and len((folder / ".staging-g1" / "lines.txt").read_text().split()) >= 4, "four lines were written")
    (job,) = JobStore(tmp_path / "iris-home").all()
    os.kill(job.supervisor_pid, signal.SIGKILL)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode != 0 and "supervisor" in stderr, stderr[-3000:]
    # The runner that recorded FAILED also ended the replica: it did not write on for its 60 s.
    assert not _alive(orphan), stderr[-3000:]
    assert f"Ending replica 0 (pid {orphan}" in stderr
    second = _start(tmp_path, seconds=1, ignores_fence=True)  # rerun at once; its step writes for a second
    stdout, stderr = second.communicate(timeout=180)
    log = stdout + stderr
    assert second.returncode == 0, log[-4000:]
    status = read_status(str(folder))
    assert status.status == "SUCCESS" and status.generation == 2
    # One writer, the rerun's, from its first line: the fenced-off execution's lines are not committed.
    assert _writers(folder / "lines.txt") == [_replica_pid(_starts(tmp_path)[1])]
    assert "g2 starts from a clean folder (g1 left no resumable state" in log


def test_a_job_that_finishes_after_its_runner_died_is_recorded_not_run_again(tmp_path):
    folder = _start_then_kill_the_runner(tmp_path)
    (tmp_path / "markers" / "release").touch()
    # No runner is alive: the job's replica 0 commits the output and records SUCCESS itself.
    _wait_until(lambda: read_status(str(folder)).status == "SUCCESS", "the job committed its output", timeout=60)
    second = _start(tmp_path)
    log = _finish(second, tmp_path)
    assert "OUTCOME CACHED" in log
    assert len(_starts(tmp_path)) == 1 and len(JobStore(tmp_path / "iris-home").all()) == 1
    assert _writers(folder / "lines.txt") == [_replica_pid(_starts(tmp_path)[0])]
    assert not list(folder.glob(".staging*"))


def test_a_rerun_from_another_iris_home_adopts_the_live_job_the_step_folder_names(tmp_path):
    folder = _start_then_kill_the_runner(tmp_path)
    before = read_status(str(folder))
    assert before.status == "RUNNING" and before.job and before.iris_home == str((tmp_path / "iris-home").resolve())
    second = _start(tmp_path, iris_home="another-iris-home")
    _wait_until(lambda: read_status(str(folder)).holder != before.holder, "the second runner held the step",
                timeout=120, runner=second)
    log = _finish(second, tmp_path)
    assert f"iris job {before.job} from an earlier runner is still running" in log
    assert len(_starts(tmp_path)) == 1
    assert len(JobStore(tmp_path / "iris-home").all()) == 1
    assert not (tmp_path / "another-iris-home").exists() or not JobStore(tmp_path / "another-iris-home").all()
    assert _writers(folder / "lines.txt") == [_replica_pid(_starts(tmp_path)[0])]


def test_killing_runner_and_supervisor_together_leaves_a_replica_the_rerun_waits_for(tmp_path):
    folder = _start_then_kill_the_runner(tmp_path, with_supervisor=True)
    orphan = _replica_pid(_starts(tmp_path)[0])
    first_runner = _lock_holder(folder)  # the killed runner's lease, left behind
    assert first_runner is not None
    second = _start(tmp_path)
    # The second runner holds the step's lease; the orphan still heartbeats, so it waits for it
    # instead of starting a second writer, however long that takes.
    _wait_until(lambda: _lock_holder(folder) not in (None, first_runner), "the second runner held the step",
                runner=second)
    time.sleep(3)
    assert len(_starts(tmp_path)) == 1 and _alive(orphan)
    log = _finish(second, tmp_path)
    assert "has no runner, but replica 0" in log and "waiting for it to finish" in log
    assert "OUTCOME CACHED" in log
    assert len(_starts(tmp_path)) == 1
    assert _writers(folder / "lines.txt") == [orphan]
    assert read_status(str(folder)).status == "SUCCESS"


def test_staging_folders_of_stopped_executions_go_at_the_next_commit_and_a_live_ones_stays(tmp_path):
    import json as json_module

    from marin.execution.ownership.step_ownership import discard_stale_staging, heartbeat_url
    from rigging.lease import ProcessIdentity

    step = tmp_path / "step"
    # g1 staged as earlier versions named the folder (.staging/g1); g2 and g3 as now (.staging-g2).
    staged = {1: step / ".staging" / "g1", 2: step / ".staging-g2", 3: step / ".staging-g3"}
    for folder in staged.values():
        folder.mkdir(parents=True)
        (folder / "part.bin").write_bytes(b"x")
    me = ProcessIdentity.of_this_process()  # a replica of g2 that still runs: this very process
    for generation, ended in ((1, True), (2, False)):
        Path(heartbeat_url(str(step), generation, 0)).parent.mkdir(parents=True, exist_ok=True)
        Path(heartbeat_url(str(step), generation, 0)).write_text(json_module.dumps({
            "generation": generation, "replica": 0, "host": me.host, "pid": me.pid, "pid_started": me.started,
            "pid_namespace": me.namespace, "heartbeat_at": time.time(), "ttl_s": 10, "ended": ended}))
    assert discard_stale_staging(str(step), 3) == [".staging/g1"]  # g3 is the committing execution's own
    assert not (step / ".staging").exists() and (staged[2] / "part.bin").exists() and (staged[3] / "part.bin").exists()
    assert discard_stale_staging(str(step), 1) == []  # a first execution: none came before it
