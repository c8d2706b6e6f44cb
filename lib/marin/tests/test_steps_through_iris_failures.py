"""Steps through iris on the suite's Slurm that do not succeed: each spends the budget it should,
keeps its log, and bad settings are refused before anything runs, in one line, without hanging."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from fray.cluster import ResourceConfig, ship_by_value
from iris import JobStore
from iris.attempt_log import list_attempts, read_log
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the local Slurm is Linux only")

ship_by_value(__name__)  # the step functions below travel to the job with their code
SMALL = {"cpu": 1, "ram": "256m"}


def explode(output_path):
    print("reading the input")
    raise ValueError("row 7 has no text field")


def dawdle(output_path):
    print("started, and never finishing", flush=True)
    time.sleep(600)


@pytest.fixture
def iris_home(tmp_path, monkeypatch):
    home = tmp_path / "iris-home"
    monkeypatch.setenv("IRIS_HOME", str(home))
    return home


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_raising_step_spends_its_failure_budget_and_a_time_limit_kill_is_a_failure(slurm_cluster, tmp_path, iris_home):
    steps = [
        StepSpec("explode", explode, resources=ResourceConfig.with_cpu(**SMALL, max_retries_failure=1)),
        # Slurm counts time limits in minutes: one minute is the shortest it enforces.
        StepSpec("dawdle", dawdle, resources=ResourceConfig.with_cpu(**SMALL, time_limit_s=60)),
    ]
    runner = StepRunner(prefix=str(tmp_path / "prefix"), cluster="iris:slurm", heartbeat_s=1.0)
    report = runner.run(steps, raise_on_failure=False, max_concurrent=2)
    assert report.outcome_of("explode").outcome == "failed" and report.outcome_of("dawdle").outcome == "failed"
    store = JobStore(iris_home)

    exploded = list_attempts(report.outcome_of("explode").output_path)
    assert [a.record.outcome for a in exploded] == ["FAILED", "FAILED"]
    for attempt in exploded:
        text = read_log(attempt.logs[0]).decode()
        assert "reading the input" in text and "ValueError: row 7 has no text field" in text and "Traceback" in text
    job = store.get(exploded[0].record.job_id)
    assert (job.state.value, job.failures, job.preemptions) == ("FAILED", 2, 0)
    assert "ValueError: row 7 has no text field" in report.outcome_of("explode").error  # the log's tail, in the error

    (late,) = list_attempts(report.outcome_of("dawdle").output_path)
    assert late.record.outcome == "TIMED_OUT" and "time limit" in late.record.reason
    assert "started, and never finishing" in read_log(late.logs[0]).decode()
    job = store.get(late.record.job_id)
    assert (job.state.value, job.failures, job.preemptions) == ("FAILED", 1, 0)


def _marin_run(script: str, tmp_path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    (tmp_path / "exp.py").write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "-m", "marin.cli", "run", str(tmp_path / "exp.py")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


EXPERIMENT = """
    from fray.cluster import ResourceConfig
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def never(output_path):
        raise AssertionError("must not run")

    if __name__ == "__main__":
        StepRunner().run([StepSpec("never", never, resources={resources})])
"""


@pytest.mark.parametrize(
    ("setting", "resources", "expected"),
    [
        ("iris:slurm:nosuchpartition", "ResourceConfig.with_cpu()", "nosuchpartition"),
        ("iris:slurm", "ResourceConfig.with_gpu('H100', 1)", "H100"),
        ("iris:kubernetes", "ResourceConfig.with_cpu()", "kubernetes"),
    ],
    ids=["unknown-partition", "gpu-type-missing", "unknown-engine"],
)
def test_bad_cluster_settings_are_one_line_before_anything_runs(slurm_cluster, tmp_path, setting, resources, expected):
    import os

    env = {**os.environ, **slurm_cluster.env, "MARIN_CLUSTER": setting, "MARIN_PREFIX": str(tmp_path / "prefix"),
           "IRIS_HOME": str(tmp_path / "iris-home")}
    result = _marin_run(EXPERIMENT.format(resources=resources), tmp_path, env)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("marin")]
    assert len(errors) == 1 and expected in errors[0] and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "prefix").exists() or not list((tmp_path / "prefix").rglob(".executor_status"))


def test_a_slurm_controller_that_is_down_is_one_line_and_no_hang(tmp_path):
    import os

    from fray.cluster.slurm_local import missing_slurm

    if missing_slurm() is not None:
        pytest.skip(missing_slurm())
    # A configuration whose controller port nothing listens on.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort=9\nAuthType=auth/none\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=localhost Default=YES\n")
    env = {**os.environ, "SLURM_CONF": str(conf), "MARIN_CLUSTER": "iris:slurm", "MARIN_PREFIX": str(tmp_path / "prefix"),
           "IRIS_HOME": str(tmp_path / "iris-home")}
    started = time.monotonic()
    result = _marin_run(EXPERIMENT.format(resources="ResourceConfig.with_cpu()"), tmp_path, env, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("marin")]
    assert len(errors) == 1 and "Slurm" in errors[0] and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert time.monotonic() - started < 100
