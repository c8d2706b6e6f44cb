"""No Slurm job outlives its generation: a step's jobs carry its execution's tag and a time limit, and
whoever fences an execution off cancels its jobs, even one whose supervisor died before starting it.

The suite's private Slurm is filled by a blocker job so that the step's replica waits in the queue;
its supervisor is then SIGKILLed, the way a chaos run caught it: submitted, never started, holding
its place for ever (before the fence cancelled it, two such leaks filled a 4-CPU cluster).
"""

from __future__ import annotations

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

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the local Slurm is Linux only")]

RUNNER = textwrap.dedent(
    """
    import pathlib, sys, time
    from fray.cluster import ResourceConfig
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def quick(ctx):
        pathlib.Path(ctx.output_path, "made.txt").write_text("made")
        return "made"

    if __name__ == "__main__":
        step = StepSpec("queued", quick, resources=ResourceConfig.with_cpu(cpu=1, ram="256m"))
        report = StepRunner(prefix=sys.argv[1], cluster="iris:slurm", heartbeat_s=0.5).run([step], raise_on_failure=False)
        print("OUTCOME", report.outcome_of("queued").outcome.name, flush=True)
    """
)


def _squeue(env: dict[str, str]) -> list[dict[str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k|%l|%j"], env=env, capture_output=True, text=True, timeout=30).stdout
    return [dict(zip(("id", "state", "tag", "limit", "name"), line.split("|"))) for line in out.splitlines() if line.strip()]


def _wait_until(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting until {what}")


def _blocker(slurm_cluster, tmp_path, cpus: int):
    """A job holding ``cpus`` of the cluster's CPUs, started; cancelled on the way out."""
    env = {**os.environ, **slurm_cluster.env}
    script = tmp_path / "blocker.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH --cpus-per-task={cpus}\n#SBATCH --mem=64M\n#SBATCH --time=10\n"
                      f"#SBATCH --output={tmp_path}/blocker.log\nsleep 600\n")
    blocker = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True,
                             timeout=30).stdout.strip().split(";")[0]
    _wait_until(lambda: any(job["id"] == blocker and job["state"] == "RUNNING" for job in _squeue(env)), "the blocker ran")
    try:
        yield env, blocker
    finally:
        subprocess.run(["scancel", blocker], env=env, capture_output=True, timeout=30)


@pytest.fixture
def blocked(slurm_cluster, tmp_path):
    """All but one of the cluster's CPUs held, so a step's supervisor runs and its replica waits."""
    yield from _blocker(slurm_cluster, tmp_path, slurm_cluster.cpus - 1)


@pytest.fixture
def full(slurm_cluster, tmp_path):
    """Every CPU of the cluster held: a step's supervisor cannot even start."""
    yield from _blocker(slurm_cluster, tmp_path, slurm_cluster.cpus)


def _start(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    (tmp_path / "runner.py").write_text(RUNNER)
    return subprocess.Popen([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "prefix")], cwd=tmp_path,
                            env={**env, "IRIS_HOME": str(tmp_path / "iris-home")}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _queued_replica(env: dict[str, str]) -> dict[str, str] | None:
    return next((job for job in _squeue(env) if job["name"].endswith("-attempt-1") and job["state"] == "PENDING"), None)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("also_kill_the_runner", [False, True], ids=["runner-lives", "rerun-cancels"])
def test_a_replica_queued_when_its_supervisor_dies_is_cancelled_not_left_holding_its_place(blocked, tmp_path,
                                                                                           also_kill_the_runner):
    env, blocker = blocked
    runner = _start(tmp_path, env)
    try:
        replica = _wait_until(lambda: _queued_replica(env), "the step's replica was queued behind the blocker")
        ours = [job for job in _squeue(env) if job["id"] != blocker]
        # Each of the step's jobs (its supervisor, its replica) carries its execution's tag and a time limit.
        assert len(ours) == 2 and all(job["tag"].startswith("marin-step-") and job["tag"].endswith("-g1") for job in ours), ours
        assert all(job["limit"] not in ("UNLIMITED", "NOT_SET", "") for job in ours), ours
        (job,) = JobStore(tmp_path / "iris-home", create=False).all()
        if also_kill_the_runner:
            runner.kill()
        os.kill(job.supervisor_pid, signal.SIGKILL)
        log, _ = runner.communicate(timeout=180)
        if not also_kill_the_runner:
            # The runner that saw its supervisor die recorded FAILED and cancelled what the job had queued.
            assert "OUTCOME FAILED" in log and f"Cancelling Slurm job(s) of fenced-off executions" in log, log[-4000:]
            assert replica["id"] in log
        _, status = None, read_status(str(next((tmp_path / "prefix").glob("queued-*"))))
        if not also_kill_the_runner:
            assert not any(job["id"] == replica["id"] for job in _squeue(env)), _squeue(env)
        else:
            # Nobody has fenced it off yet: the dead runner's execution still names it.
            assert status.status == "RUNNING" and any(job["id"] == replica["id"] for job in _squeue(env))

        # The rerun (the blocker still there) fences g1 off: its queued replica is cancelled, by its tag.
        rerun = _start(tmp_path, env)
        _wait_until(lambda: not any(job["id"] == replica["id"] for job in _squeue(env)), "the g1 replica was cancelled", 90)
        subprocess.run(["scancel", blocker], env=env, capture_output=True, timeout=30)
        log, _ = rerun.communicate(timeout=300)
        assert "OUTCOME RAN" in log, log[-4000:]
        if also_kill_the_runner:
            assert f"{replica['id']} (g1, " in log, log[-4000:]  # pending still, or started once the supervisor's CPU was free
        status = read_status(str(next((tmp_path / "prefix").glob("queued-*"))))
        assert status.status == "SUCCESS" and status.generation == 2
        # Nothing of either execution is left in the queue.
        _wait_until(lambda: not [job for job in _squeue(env) if job["tag"].startswith("marin-step-")],
                    "no step's job was left in the queue", 90)
    finally:
        for process in (runner, locals().get("rerun")):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=30)


@pytest.mark.timeout(300)
def test_a_job_that_cannot_start_is_stopped_after_the_start_timeout_naming_where_it_waits(full, tmp_path, monkeypatch):
    import marin.execution.running.iris_steps as iris_steps
    from fray.cluster import ResourceConfig
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    env, _ = full
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    monkeypatch.setattr(iris_steps, "START_TIMEOUT_S", 5.0)
    step = StepSpec("never-placed", _never_called, resources=ResourceConfig.with_cpu(cpu=1, ram="256m"))
    started = time.monotonic()
    report = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:slurm", heartbeat_s=0.5).run(
        [step], raise_on_failure=False)
    error = report.outcome_of("never-placed").error
    assert "did not start within 5 s" in error and "its supervisor is Slurm job " in error, error
    assert time.monotonic() - started < 120
    # Its supervisor, still pending, was cancelled with it: the full cluster keeps no job of the step.
    assert not [job for job in _squeue(env) if job["tag"].startswith("marin-step-")], _squeue(env)


def _never_called(output_path):
    raise AssertionError("the step must not start: the cluster is full")
