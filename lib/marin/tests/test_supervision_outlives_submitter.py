"""Supervision outlives the submitter: kill every process on the submitting side of a step running
through iris on Slurm or on a Ray cluster, and the job still finishes, commits its output, and is
seen from another shell.

"The submitting side" is the runner and every process it started outside Slurm (its whole process
tree, detached sessions included), as closing a laptop would end them. Replicas and, with
:mod:`iris.placement`, the job's supervisor are Slurm jobs (children of ``slurmstepd``) or Ray
actors (children of the node's raylet).
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

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

RUNNER = textwrap.dedent(
    """
    import os, pathlib, sys, time
    from fray.cluster import ResourceConfig
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def waits_for_release(ctx):
        marker = pathlib.Path(os.environ["MARIN_TEST_MARKERS"])
        marker.mkdir(exist_ok=True)
        (marker / "started").write_text(ctx.output_path)
        deadline = time.time() + 300
        while time.time() < deadline and not (marker / "release").exists():
            ctx.check_lease()
            time.sleep(0.1)
        with open(os.path.join(ctx.output_path, "made.txt"), "w") as handle:
            handle.write("made once")
        return "finished"

    if __name__ == "__main__":
        step = StepSpec("outlives", waits_for_release, resources=ResourceConfig.with_cpu(cpu=1, ram="256m"))
        report = StepRunner(prefix=sys.argv[1], cluster=sys.argv[2], heartbeat_s=0.5).run([step])
        print("OUTCOME", report.outcome_of("outlives").outcome.name, flush=True)
    """
)


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it, by parent pid (detached sessions included)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def _wait_until(condition, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting until {what}")


def _kill_the_submitting_side_then_finish(tmp_path: Path, cluster: str, engine_env: dict[str, str]) -> None:
    (tmp_path / "runner.py").write_text(RUNNER)
    prefix, markers, iris_home = tmp_path / "prefix", tmp_path / "markers", tmp_path / "iris-home"
    env = {**os.environ, **engine_env, "IRIS_HOME": str(iris_home), "MARIN_TEST_MARKERS": str(markers)}
    runner = subprocess.Popen([sys.executable, str(tmp_path / "runner.py"), str(prefix), cluster], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until(lambda: (markers / "started").exists() or runner.poll() is not None, "the step started", 240)
        assert runner.poll() is None, runner.stderr.read()[-3000:]
        submitting_side = _descendants(runner.pid)
        for pid in submitting_side:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        runner.communicate(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
    (job,) = JobStore(iris_home).all()
    (markers / "release").touch()
    step_folder = Path(markers.joinpath("started").read_text()).parent  # it wrote into <step>/.staging-g1
    _wait_until(lambda: getattr(read_status(str(step_folder)), "status", None) == "SUCCESS",
                "the job committed the step's output", 240)
    assert (step_folder / "made.txt").read_text() == "made once"
    # From another shell: iris saw the job through to the end, and a rerun takes the step as cached.
    _wait_until(lambda: JobStore(iris_home).get(job.job_id).state.value == "SUCCEEDED", "iris recorded SUCCEEDED", 60)
    listing = subprocess.run([str(Path(sys.executable).parent / "iris"), "job", "list"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert job.job_id in listing.stdout and "SUCCEEDED" in listing.stdout, listing.stdout + listing.stderr
    status = subprocess.run([str(Path(sys.executable).parent / "marin"), "status", "--prefix", str(prefix), "--json"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr[-2000:]
    assert [row["status"] for row in json.loads(status.stdout)] == ["SUCCESS"], status.stdout[-2000:]
    rerun = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(prefix), cluster], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=180)
    assert "OUTCOME CACHED" in rerun.stdout, rerun.stderr[-3000:]
    assert len(JobStore(iris_home).all()) == 1
    assert JobStore(iris_home).get(job.job_id).supervisor_job is not None  # it ran as the engine's job


@pytest.mark.timeout(600)
def test_killing_everything_on_the_submitting_side_leaves_a_slurm_job_to_finish_and_commit(slurm_cluster, tmp_path):
    _kill_the_submitting_side_then_finish(tmp_path, "iris:slurm", slurm_cluster.env)


@pytest.mark.timeout(600)
def test_killing_everything_on_the_submitting_side_leaves_a_ray_job_to_finish_and_commit(tmp_path):
    pytest.importorskip("ray", reason="the Ray engine needs `pip install 'marin[ray]'`")
    from fray.cluster.ray_nodes import LocalRayCluster

    with LocalRayCluster() as nodes:
        nodes.start_head("head", cpus=2)
        _kill_the_submitting_side_then_finish(tmp_path, "iris:ray", {**nodes.env, **nodes.driver_env})
