"""Steps through iris on the local engine: gangs, a runner that dies, a run that is stopped.

The local engine runs each replica as a child process of the job's supervisor, so these check the
runner's side of the iris path quickly; tests/test_steps_through_iris*.py run it on Slurm and Ray.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fray.cluster import ResourceConfig, ship_by_value
from iris import JobStore, PREEMPTED_EXIT_CODE
from iris.attempt_log import list_attempts, read_log
from marin import cli
from marin.execution.records.executor_files import read_status
from marin.execution.running.iris_steps import IrisStepExecutor
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

ship_by_value(__name__)


def where_am_i(output_path):
    replica = int(os.environ["IRIS_REPLICA_INDEX"])
    print(f"replica {replica} of {os.environ['IRIS_NUM_REPLICAS']}, coordinator {os.environ['IRIS_COORDINATOR_ADDRESS']}")
    with open(os.path.join(output_path, f"replica-{replica}.json"), "w") as handle:
        json.dump({"replica": replica, "coordinator": os.environ["IRIS_COORDINATOR_ADDRESS"]}, handle)
    return {"answered_by": replica}


def test_a_step_with_replicas_runs_as_a_gang_and_replica_0_gives_the_result(tmp_path, monkeypatch):
    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    step = StepSpec("gang", where_am_i, resources=ResourceConfig.with_cpu(ram="256m", replicas=2))
    report = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:local").run([step])
    output = Path(report.outcome_of("gang").output_path)
    assert report.outcome_of("gang").result == {"answered_by": 0}
    records = [json.loads((output / f"replica-{i}.json").read_text()) for i in (0, 1)]
    assert records[0]["coordinator"] == records[1]["coordinator"]  # one jax.distributed coordinator for both
    (attempt,) = list_attempts(str(output))
    assert attempt.record.replicas == 2 and len(attempt.logs) == 2
    assert len(set(attempt.record.engine_jobs)) == 2  # where each replica ran, by the engine's own job id
    first, second = (read_log(url).decode() for url in attempt.logs)
    assert "replica 0 of 2" in first and "replica 1 of 2" not in first
    assert "replica 1 of 2" in second and "replica 0 of 2" not in second
    # Run again: the step is cached, and iris never hears of it.
    again = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:local").run([step])
    assert again.cached == ["gang"] and len(JobStore(tmp_path / "iris-home").all()) == 1


def slow_second_replica(output_path):
    replica = int(os.environ["IRIS_REPLICA_INDEX"])
    if replica == 1:
        time.sleep(2.0)  # replica 0 is long done by now: it must wait before it commits
    with open(os.path.join(output_path, f"share-{replica}.txt"), "w") as handle:
        handle.write(str(replica))
    return replica


def test_replica_0_commits_a_gangs_output_only_once_every_replica_wrote_its_share(tmp_path, monkeypatch):
    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    step = StepSpec("shares", slow_second_replica, resources=ResourceConfig.with_cpu(ram="256m", replicas=2))
    report = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:local").run([step])
    output = Path(report.outcome_of("shares").output_path)
    assert sorted(p.name for p in output.glob("share-*.txt")) == ["share-0.txt", "share-1.txt"]
    assert not list(output.glob(".staging*"))
    (job,) = JobStore(tmp_path / "iris-home").all()
    assert job.state.value == "SUCCEEDED" and job.attempts == 1


RUNNER = textwrap.dedent(
    """
    import os, pathlib, sys, time
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def patient(ctx):
        # The job's own process: what it needs comes in the environment, which iris passes on.
        marker = pathlib.Path(os.environ["MARIN_TEST_MARKERS"])
        marker.mkdir(exist_ok=True)
        (marker / f"started-{time.time_ns()}").write_text(ctx.output_path)
        # It runs until the test releases it (a file), or for at most MARIN_TEST_SECONDS.
        deadline = time.time() + float(os.environ["MARIN_TEST_SECONDS"])
        while time.time() < deadline and not (marker / "release").exists():
            ctx.check_lease()  # raises once the job is stopped (SIGTERM)
            time.sleep(0.05)
        return "finished"

    if __name__ == "__main__":
        StepRunner(prefix=sys.argv[1], cluster="iris:local", lease_ttl_s=3, heartbeat_s=0.5).run([StepSpec("patient", patient)])
    """
)


def _start(tmp_path: Path, seconds: float) -> subprocess.Popen:
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {**os.environ, "IRIS_HOME": str(tmp_path / "iris-home"), "MARIN_TEST_MARKERS": str(tmp_path / "markers"),
           "MARIN_TEST_SECONDS": str(seconds)}
    return subprocess.Popen([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "prefix")], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)


def _step_folder(work_path: Path) -> Path:
    """The step's folder, from the staging folder its execution writes into (``<step>/.staging-gN``)."""
    return work_path.parent if work_path.name.startswith(".staging-g") else work_path


def _wait_for_start(tmp_path: Path, runner: subprocess.Popen, count: int = 1) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        started = sorted((tmp_path / "markers").glob("started-*")) if (tmp_path / "markers").exists() else []
        if len(started) >= count:
            return _step_folder(Path(started[-1].read_text()))
        assert runner.poll() is None, runner.stderr.read()[-3000:]
        time.sleep(0.05)
    pytest.fail("the step did not start within 60 s")


def test_sigterm_to_the_runner_stops_the_steps_job_and_the_run_exits_75(tmp_path):
    runner = _start(tmp_path, seconds=120)
    output = _wait_for_start(tmp_path, runner)
    runner.send_signal(signal.SIGTERM)
    _, stderr = runner.communicate(timeout=120)
    assert runner.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
    (job,) = JobStore(tmp_path / "iris-home").all()
    assert job.state.value == "STOPPED"
    (attempt,) = list_attempts(str(output))
    assert attempt.record.outcome == "STOPPED"
    status = read_status(str(output))
    assert status.status == "FAILED" and status.job == job.job_id and "interrupted" in status.error


def test_a_runner_that_dies_leaves_its_job_running_and_the_next_runner_adopts_it(tmp_path):
    first = _start(tmp_path, seconds=120)
    output = _wait_for_start(tmp_path, first)
    first.kill()  # no chance to stop anything: its job goes on
    first.communicate(timeout=30)
    status = read_status(str(output))
    assert status.status == "RUNNING" and status.job
    second = _start(tmp_path, seconds=120)
    # The job keeps running until the second runner holds the step (it has then read the job
    # id the first one left); only then may the step finish, however slowly the runner started.
    deadline = time.monotonic() + 120
    while read_status(str(output)).holder == status.holder and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "markers" / "release").touch()
    _, stderr = second.communicate(timeout=180)
    assert second.returncode == 0, stderr[-3000:]
    assert f"iris job {status.job} from an earlier runner is still running" in stderr
    assert len(list((tmp_path / "markers").glob("started-*"))) == 1  # the step ran once
    assert [job.job_id for job in JobStore(tmp_path / "iris-home").all()] == [status.job]
    assert read_status(str(output)).status == "SUCCESS"


def _replica_pids(tmp_path: Path) -> list[int]:
    """The processes running a replica of a step under ``tmp_path`` (its call is in the step's folder)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # it ended while we looked
            continue
        if b"marin.execution.running.step_job" in words and any(str(tmp_path).encode() in word for word in words):
            pids.append(int(cmdline.parent.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the replica's process in /proc")
def test_a_preemption_is_said_on_the_console_in_the_summary_at_the_end_of_its_log_and_in_marin_status(tmp_path, capsys):
    runner = _start(tmp_path, seconds=120)
    output = _wait_for_start(tmp_path, runner)
    (replica,) = _replica_pids(tmp_path)
    os.kill(replica, signal.SIGTERM)  # what a scheduler reclaiming the machine does
    _wait_for_start(tmp_path, runner, count=2)
    (tmp_path / "markers" / "release").touch()
    _, stderr = runner.communicate(timeout=180)
    assert runner.returncode == 0, stderr[-3000:]
    # The runner's console, while iris retries it, and its summary at the end.
    assert "Step patient: attempt 1 PREEMPTED (exit 75); iris retries it, 1 of 10 preemptions spent" in stderr
    assert "Step patient: attempt 2 SUCCEEDED" in stderr
    assert "Run finished: 1 ran, 0 cached, 0 failed, 0 dep-failed; patient ran in 2 attempts, 1 preempted" in stderr
    # The preempted attempt's log reads as a planned stop: no traceback, the step's last line names the
    # reason, and iris's line after it says what came next.
    first, second = list_attempts(str(output))
    assert (first.record.outcome, second.record.outcome) == ("PREEMPTED", "SUCCEEDED")
    lines = read_log(first.logs[0]).decode().rstrip().splitlines()
    assert not any("Traceback" in line for line in lines), lines
    own = [line for line in lines if line.strip() and not line.startswith("iris: ")]
    assert own[-1].endswith("Step patient stopped: preempted by SIGTERM; RunCancelled: The run was preempted (SIGTERM); "
                            "step 'patient' stops here. Exit 75: iris runs it again while its preemption budget allows")
    assert lines[-1] == "iris: this attempt ended PREEMPTED (exit 75); iris retries it, 1 of 10 preemptions spent"
    # marin status, from the step folder alone (any shell on the same prefix).
    assert cli.main(["status", "--prefix", str(tmp_path / "prefix")]) == 0
    assert "(2 attempts, 1 preempted)" in capsys.readouterr().out
    assert cli.main(["status", "--json", "--prefix", str(tmp_path / "prefix")]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["attempts"], listed["preemptions"], listed["failed_attempts"]) == (2, 1, 0)


def fails_once(output_path):
    if os.environ["IRIS_ATTEMPT"] == "1":
        raise ValueError("a bug that only the first attempt hits")
    return "fine"


def test_a_failed_attempt_iris_retries_is_one_console_line_and_its_traceback_stays_in_its_log(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    step = StepSpec("flaky", fails_once, resources=ResourceConfig.with_cpu(ram="256m", max_retries_failure=1))
    with caplog.at_level("INFO", logger="marin.execution.step_runner"):
        report = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:local").run([step])
    said = [record.getMessage() for record in caplog.records if record.name == "marin.execution.step_runner"]
    assert "Step flaky: attempt 1 FAILED (exit 1); iris retries it, 1 of 1 failure spent; its log: marin logs flaky --attempt 1" in said
    assert report.outcome_of("flaky").attempts.describe() == "2 attempts, 1 failed"
    assert report.summary() == "1 ran, 0 cached, 0 failed, 0 dep-failed; flaky ran in 2 attempts, 1 failed"
    first, _ = list_attempts(report.outcome_of("flaky").output_path)
    log = read_log(first.logs[0]).decode()
    assert "Traceback" in log and "ValueError: a bug that only the first attempt hits" in log  # a real crash keeps it


def trains_for_a_while(output_path):
    import logging

    log = logging.getLogger("levanter.trainer")
    for step in range(1, 41):
        time.sleep(0.05)
        log.info("step %d/40  loss %.4f  lr 0.003  grad_norm 0.5  50000 tokens/s  elapsed 0m%02ds  ETA 0m%02ds",
                 step, 6.0 - 0.05 * step, step // 20, (40 - step) // 20)
        log.info("a line that is not progress")
    return "trained"


def test_a_cluster_steps_progress_reaches_the_runners_console_at_a_bounded_rate(tmp_path, monkeypatch, caplog):
    import marin.execution.running.progress_relay as progress_relay

    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    monkeypatch.setattr(progress_relay, "PROGRESS_EVERY_S", 0.5)
    step = StepSpec("trainer", trains_for_a_while, resources=ResourceConfig.with_cpu(ram="256m"))
    started = time.monotonic()
    with caplog.at_level("INFO", logger="marin.execution.step_runner"):
        report = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:local").run([step])
    waited = time.monotonic() - started
    assert report.outcome_of("trainer").result == "trained"
    said = [record.getMessage() for record in caplog.records if record.name == "marin.execution.step_runner"]
    assert said.count("Step trainer: its progress is shown here at most every 0.5s; the whole log: "
                      "marin logs trainer --follow") == 1
    relayed = [line for line in said if line.startswith("Step trainer: step ")]
    # The newest line when one is due (the first at once), never more often than every 0.5 s, and the last at the end.
    assert 2 <= len(relayed) <= waited / 0.5 + 2, relayed
    assert relayed[-1] == "Step trainer: step 40/40 loss 4.0000 lr 0.003 grad_norm 0.5 50000 tokens/s elapsed 0m02s ETA 0m00s"
    assert all(re.fullmatch(r"Step trainer: step \d+/40 loss [\d.]+ .* tokens/s elapsed \S+ ETA \S+", line) for line in relayed)
    assert not any("not progress" in line for line in said)
    steps = [int(re.search(r"step (\d+)/", line).group(1)) for line in relayed]
    assert steps == sorted(set(steps))  # each newer than the last


def preempted_after_some_steps(output_path):
    import logging

    log = logging.getLogger("levanter.trainer")
    attempt = int(os.environ["IRIS_ATTEMPT"])
    for step in range(1, 6):
        log.info("step %d/5  loss %.4f  50000 tokens/s  elapsed 0m00s  ETA 0m01s", step, 6.0 - step / 10 - attempt)
        if step == 1:
            sys.stdout.flush()
            # The runner relays step 1 at once; steps 2 to 5 then wait out its 30 s. The second attempt
            # waits longer than the runner's look (below): the runner's first look after the first
            # attempt ended may then find the second attempt's first line already logged.
            time.sleep(2.0 if attempt == 1 else 4.0)
    if attempt == 1:
        sys.stdout.flush()
        os._exit(PREEMPTED_EXIT_CODE)
    return "resumed"


def test_a_preempted_attempts_last_figures_come_before_the_line_saying_how_it_ended(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    # The runner looks every 3 s rather than every 0.5 s: the first attempt can start and end between two of its
    # looks, and the second start and log its first line before the look that finds the first ended.
    monkeypatch.setattr(IrisStepExecutor, "__init__", functools.partialmethod(IrisStepExecutor.__init__, poll_s=3.0))
    step = StepSpec("twice", preempted_after_some_steps, resources=ResourceConfig.with_cpu(ram="256m"))
    with caplog.at_level("INFO", logger="marin.execution.step_runner"):
        report = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:local").run([step])
    assert report.outcome_of("twice").result == "resumed"
    said = [record.getMessage() for record in caplog.records if record.name == "marin.execution.step_runner"]
    ended = next(i for i, line in enumerate(said) if line.startswith("Step twice: attempt 1 PREEMPTED"))
    first_attempt = [line for line in said[:ended] if line.startswith("Step twice: step ")]
    assert first_attempt[-1] == "Step twice: step 5/5 loss 4.5000 50000 tokens/s elapsed 0m00s ETA 0m01s"
    assert [line for line in said[ended:] if line.startswith("Step twice: step ")][-1].startswith("Step twice: step 5/5 loss 3.5000")
