"""The step runner on a real local Ray cluster (2 CPUs): steps as Ray tasks, caching, fail-fast resources."""

import json
import os
from pathlib import Path

import pytest

from fray.cluster import ResourceConfig, ship_by_value, use_client

# Ray starts its processes with fork+exec; JAX, if another test imported it, warns about any fork.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")

from fray.cluster.ray_client import RayClient  # noqa: E402

from marin.execution.artifact import load_artifact  # noqa: E402
from marin.execution.running.step_executor import ClientStepExecutor, executor_for  # noqa: E402
from marin.execution.step_runner import StepRunner  # noqa: E402
from marin.execution.step_spec import StepSpec  # noqa: E402

# Ray workers cannot import this test file by name; its step functions travel with their code.
ship_by_value(__name__)

SMALL = ResourceConfig.with_cpu(ram="64m")


@pytest.fixture(scope="module")
def ray_client():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield RayClient()
    ray.shutdown()


def write_rows(output_path):
    Path(output_path, "rows.txt").write_text("a\nb\nc\n")
    return {"rows": 3, "pid": os.getpid()}


def count_rows(ctx):
    upstream = ctx.load_artifact("dag/rows")
    lines = Path(upstream.output_path, "rows.txt").read_text().split()
    return {"rows": len(lines), "pid": os.getpid(), "worker": ray.get_runtime_context().get_worker_id() is not None}


def shout(ctx):
    text = Path(ctx.dep_output_path("dag/rows"), "rows.txt").read_text()
    Path(ctx.output_path, "loud.txt").write_text(text.upper())
    return {"pid": os.getpid()}


def test_dag_runs_as_ray_tasks_and_rerun_is_cached(ray_client, tmp_path):
    rows = StepSpec("dag/rows", fn=write_rows, hash_attrs={"n": 3}, resources=SMALL)
    counted = StepSpec("dag/count", fn=count_rows, deps=[rows], resources=SMALL)
    loud = StepSpec("dag/shout", fn=shout, deps=[rows], resources=SMALL)
    runner = StepRunner(prefix=str(tmp_path), client=ray_client)

    report = runner.run([counted, loud])
    assert report.ran == ["dag/rows", "dag/count", "dag/shout"]
    pids = {name: report.outcome_of(name).result["pid"] for name in report.ran}
    assert os.getpid() not in pids.values()  # every step ran in a Ray worker process
    assert report.outcome_of("dag/count").result["rows"] == 3
    for name in report.ran:
        folder = runner.output_path_for({"dag/rows": rows, "dag/count": counted, "dag/shout": loud}[name])
        assert json.loads(Path(folder, ".executor_status").read_text())["status"] == "SUCCESS"
        assert not Path(folder, ".executor_lock").exists()
        assert load_artifact(folder).provenance.identity
    assert Path(runner.output_path_for(loud), "loud.txt").read_text() == "A\nB\nC\n"

    again = StepRunner(prefix=str(tmp_path), client=ray_client).run([counted, loud])
    assert again.ran == [] and again.cached == ["dag/count", "dag/shout"] and again.not_needed == ["dag/rows"]


@pytest.mark.timeout(60)  # without the check the step would wait for 64 CPUs forever
def test_step_asking_for_more_than_the_cluster_fails_fast(ray_client, tmp_path):
    big = StepSpec("train/too-big", fn=lambda: None, resources=ResourceConfig.with_cpu(cpu=64))
    after = StepSpec("eval/after", fn=lambda: None, deps=[big])
    runner = StepRunner(prefix=str(tmp_path), client=ray_client)

    report = runner.run([after], raise_on_failure=False)
    assert report.failed == ["train/too-big"] and report.dep_failed == ["eval/after"]
    error = report.outcome_of("train/too-big").error
    assert "Step 'train/too-big' asks for 64 CPUs" in error and "has 2 CPUs" in error
    status = json.loads(Path(runner.output_path_for(big), ".executor_status").read_text())
    assert status["status"] == "FAILED" and "64 CPUs" in status["error"]


def test_runner_uses_the_current_client(ray_client, tmp_path):
    step = StepSpec("where/am-i", fn=lambda: os.getpid(), resources=SMALL)
    with use_client(ray_client):
        assert isinstance(executor_for(ray_client), ClientStepExecutor)
        report = StepRunner(prefix=str(tmp_path)).run([step])
    assert report.outcome_of("where/am-i").result != os.getpid()


# A driver that runs a two-step DAG on the test's Ray cluster; its second step holds until released.
DRIVER = """
import pathlib, sys, time
import ray
from fray.cluster import ResourceConfig
from fray.cluster.ray_client import RayClient
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

address, prefix, scratch = sys.argv[1:]
SMALL = ResourceConfig.with_cpu(ram="64m")

def first(output_path):
    with open(pathlib.Path(scratch, "first-runs.txt"), "a") as handle:
        handle.write("ran\\n")

def second(output_path):
    while pathlib.Path(scratch, "hold").exists():
        time.sleep(0.2)

ray.init(address=address, log_to_driver=False)
one = StepSpec("killed/first", fn=first, resources=SMALL)
two = StepSpec("killed/second", fn=second, deps=[one], resources=SMALL)
StepRunner(prefix=prefix, client=RayClient()).run([two])
"""


def _status(folder):
    path = Path(folder, ".executor_status")
    return json.loads(path.read_text())["status"] if path.exists() else None


@pytest.mark.timeout(120)
def test_killed_driver_rerun_finishes_without_rerunning_finished_steps(ray_client, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "hold").touch()
    prefix = str(tmp_path / "out")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    address = ray.get_runtime_context().gcs_address

    one = StepSpec("killed/first", fn=lambda output_path: None, resources=SMALL)
    two = StepSpec("killed/second", fn=lambda output_path: "second done", deps=[one], resources=SMALL)
    runner = StepRunner(prefix=prefix, client=ray_client)
    driver = subprocess.Popen([sys.executable, str(script), address, prefix, str(scratch)])
    try:
        while _status(runner.output_path_for(two)) != "RUNNING":  # bounded by the test's timeout
            assert driver.poll() is None, "the driver exited before its second step started"
            time.sleep(0.2)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    (scratch / "hold").unlink()

    report = runner.run([two])
    assert report.cached == ["killed/first"] and report.ran == ["killed/second"]
    assert (scratch / "first-runs.txt").read_text() == "ran\n"
    assert report.outcome_of("killed/second").result == "second done"


@pytest.mark.timeout(60)
def test_lost_lease_cancels_the_remote_step(ray_client, tmp_path):
    import threading
    import time

    from rigging.lease import LeaseLostError

    from marin.execution.running.step_executor import StepCall

    def forever():
        time.sleep(600)

    call = StepCall(StepSpec("slow/step", fn=forever, resources=SMALL), str(tmp_path), {})
    threading.Timer(1.0, call.lease_lost.set).start()
    with pytest.raises(LeaseLostError, match="'slow/step' lost its lease"):
        ClientStepExecutor(ray_client).run(call)
