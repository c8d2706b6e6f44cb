"""Jobs, the one way fray turns a command into a process: placed, started, followed, stopped, released.

The same ``ProcessJob`` runs them for both clients, so the local tests pin the behaviour and the
Ray tests only what Ray adds: the job runs in an actor on a node, and a dead worker means LOST.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fray.cluster import JobHandle, JobRequest, JobStatus, LocalClient

TIMEOUT = 60


def python(code: str, **kwargs) -> JobRequest:
    return JobRequest(kwargs.pop("name", "py"), [sys.executable, "-c", code], **kwargs)


def eventually(check, what: str):
    """``check()``'s first true value within TIMEOUT seconds."""
    for _ in range(int(TIMEOUT / 0.05)):
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended


@pytest.fixture()
def client():
    client = LocalClient()
    yield client
    client.shutdown()


def test_a_placed_job_runs_only_when_started_with_the_extra_environment(client):
    job = client.submit(python("import os; print(os.environ['WHO'], os.environ['KEPT'])", env={"WHO": "request", "KEPT": "yes"}), start=False)
    assert isinstance(job, JobHandle)
    assert (job.status(), job.exit_code(), job.read_log()) == (JobStatus.PENDING, None, b"")
    host, port = job.free_address().rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    job.start({"WHO": "start"})
    assert job.wait(timeout=TIMEOUT) == JobStatus.SUCCEEDED and job.exit_code() == 0
    assert job.logs() == "start yes\n"
    with pytest.raises(RuntimeError, match="already started"):
        job.start()


def test_the_log_is_read_by_offset_while_the_job_runs(client):
    job = client.submit(python("import time; print('first'); time.sleep(1); print('second')"))
    eventually(lambda: job.read_log() == b"first\n", "the first line")
    assert job.status() == JobStatus.RUNNING
    job.wait(timeout=TIMEOUT)
    assert job.read_log(len(b"first\n")) == b"second\n"


def test_terminate_stops_everything_the_job_started(client):
    job = client.submit(JobRequest("tree", ["sh", "-c", "sleep 60 & echo $!; wait"]))
    child = int(eventually(lambda: job.read_log().strip(), "the child's pid"))
    job.terminate()
    assert job.wait(timeout=TIMEOUT) == JobStatus.STOPPED
    assert job.exit_code() == -signal.SIGTERM
    eventually(lambda: not alive(child), "the job's own child to end")


def test_a_command_that_cannot_start_is_a_failed_job_with_the_reason_in_its_log(client):
    job = client.submit(JobRequest("missing", ["no-such-program-here", "--flag"]))
    assert job.wait(timeout=TIMEOUT) == JobStatus.FAILED and job.exit_code() == 127
    assert "could not start 'no-such-program-here'" in job.logs()


def test_the_working_directory_is_used_where_it_exists(client, tmp_path):
    here = client.submit(python("import os; print(os.getcwd())", cwd=str(tmp_path)))
    elsewhere = client.submit(python("print('ran')", cwd=str(tmp_path / "not-on-this-machine")))
    assert here.wait(timeout=TIMEOUT) == elsewhere.wait(timeout=TIMEOUT) == JobStatus.SUCCEEDED
    assert here.logs().strip() == str(tmp_path) and elsewhere.logs() == "ran\n"


def test_release_stops_the_job_and_keeps_its_status(client):
    job = client.submit(python("import time; time.sleep(60)"))
    job.release()
    assert (job.status(), job.exit_code(), job.logs()) == (JobStatus.STOPPED, -signal.SIGTERM, "")
    never_started = client.submit(python("print('no')"), start=False)
    never_started.release()
    assert never_started.status() == JobStatus.STOPPED


def test_lost_is_a_finished_status():
    assert JobStatus.LOST.finished and not JobStatus.PENDING.finished and not JobStatus.RUNNING.finished


# -- on Ray ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_client():
    ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")
    from fray.cluster.ray_client import RayClient

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield RayClient()
    ray.shutdown()


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_placed_ray_job_answers_on_its_node_and_keeps_its_status_after_release(ray_client):
    from fray.cluster import ResourceConfig

    request = python("import os; print('on', os.environ['WHO']); raise SystemExit(4)", resources=ResourceConfig.with_cpu(ram="64m"))
    job = ray_client.submit(request, start=False)
    assert job.status() == JobStatus.PENDING
    host, port = job.free_address().rsplit(":", 1)
    assert host and int(port) > 0
    job.start({"WHO": "ray"})
    assert job.wait(timeout=TIMEOUT) == JobStatus.FAILED and job.exit_code() == 4
    assert job.read_log() == b"on ray\n"
    job.release()
    assert (job.status(), job.exit_code()) == (JobStatus.FAILED, 4)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_ray_job_whose_worker_dies_is_lost(ray_client):
    from fray.cluster import ResourceConfig

    # The job's parent is the Ray worker of its actor; killing that worker is a node going away, for the job.
    request = python("import os, time; print(os.getppid(), os.getpid(), flush=True); time.sleep(60)", resources=ResourceConfig.with_cpu(ram="64m"))
    job = ray_client.submit(request)
    worker, process = (int(pid) for pid in eventually(lambda: job.read_log().split(), "the job's pids"))
    try:
        os.kill(worker, signal.SIGKILL)
        assert eventually(lambda: job.status() == JobStatus.LOST, "the job to be reported lost")
        assert (job.exit_code(), job.read_log(), job.logs()) == (None, b"", "")
        job.terminate()
        job.release()
        assert job.status() == JobStatus.LOST
    finally:
        try:
            os.kill(process, signal.SIGKILL)
        except ProcessLookupError:
            pass
