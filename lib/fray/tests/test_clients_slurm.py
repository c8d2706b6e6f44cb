"""SlurmClient against a real single-node Slurm (the session's ``slurm_cluster``): jobs, exit codes,
held starts, signals, time limits, remote calls, map, resource checks and an unreachable controller."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from fray.cluster import JobRequest, JobStatus, ResourceConfig, UnschedulableError, client_from_spec, ship_by_value
from fray.cluster.slurm_client import SlurmActorsUnsupported, SlurmClient, SlurmJobRootError
from fray.cluster.slurm_commands import SlurmUnavailableError
from fray.cluster.slurm_local import LocalSlurmCluster

ship_by_value(__name__)  # the nodes cannot import this test module

SMALL = ResourceConfig.with_cpu(cpu=1, ram="64m")
TIMEOUT = 60
# A command that says it is ready, then on SIGTERM writes a marker and exits 75 ("preempted"). Python,
# not a bash trap: bash can miss a trapped signal that arrives just before its `wait`.
TRAPPING = (
    "import os, signal, sys, time\n"
    "def preempted(*_):\n"
    "    open(os.environ['MARKER'], 'w').close()\n"
    "    print('got TERM', flush=True)\n"
    "    sys.exit(75)\n"
    "signal.signal(signal.SIGTERM, preempted)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def client(slurm_cluster, tmp_path) -> SlurmClient:
    return SlurmClient(job_root=str(tmp_path / "jobs"), poll_interval_s=0.2)


def job(name: str, script: str, **options) -> JobRequest:
    return JobRequest(name, ["bash", "-c", script], resources=SMALL, **options)


def python_job(name: str, code: str, **options) -> JobRequest:
    return JobRequest(name, [sys.executable, "-I", "-c", code], resources=SMALL, **options)


def wait_for_output(handle, text: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while text not in handle.logs():
        assert not handle.status().finished, f"job ended before printing {text!r}: {handle.logs()!r}"
        assert time.monotonic() < deadline, f"no {text!r} in the job's output: {handle.logs()!r}"
        time.sleep(0.1)


def test_a_command_runs_with_its_output_in_the_log(client):
    handle = client.submit(job("hello", "echo hello from $FRAY_JOB_NAME; echo to stderr >&2",
                               env={"FRAY_JOB_NAME": "slurm"}))
    assert handle.wait(timeout=TIMEOUT) == JobStatus.SUCCEEDED
    assert handle.exit_code() == 0
    assert handle.logs() == "hello from slurm\nto stderr\n"
    assert handle.read_log(6) == b"from slurm\nto stderr\n"
    handle.release()
    assert (handle.status(), handle.exit_code(), handle.read_log(0)) == (JobStatus.SUCCEEDED, 0, b"")


def test_exit_code_75_comes_back_as_75(client):
    handle = client.submit(job("preempted", "exit 75"))
    assert (handle.wait(timeout=TIMEOUT), handle.exit_code()) == (JobStatus.FAILED, 75)


def test_a_failing_command_is_failed_with_its_code(client):
    handle = client.submit(job("failing", "echo about to fail; exit 3"))
    assert (handle.wait(timeout=TIMEOUT), handle.exit_code()) == (JobStatus.FAILED, 3)
    assert "about to fail" in handle.logs()


def test_a_held_job_reports_its_address_and_runs_with_the_start_env(client):
    handle = client.submit(job("held", "echo COORDINATOR=$COORDINATOR OWN=$OWN", env={"OWN": "request"}), start=False)
    address = handle.free_address()  # returns once the job holds its allocation
    host, port = address.rsplit(":", 1)
    assert host and 0 < int(port) < 65536
    time.sleep(0.5)
    assert handle.status() == JobStatus.PENDING  # allocated, but the command waits for start()
    assert handle.logs() == ""
    handle.start({"COORDINATOR": address})
    assert handle.wait(timeout=TIMEOUT) == JobStatus.SUCCEEDED
    assert handle.logs() == f"COORDINATOR={address} OWN=request\n"
    with pytest.raises(RuntimeError):
        handle.start({})


def test_secret_variables_reach_the_command_without_staying_in_the_job_folder(client):
    # Values checked by length, so the command line (request.json) does not carry them either.
    key, token = "wandb-0123456789abcdef", "hf_0123456789abcdefXYZ"
    handle = client.submit(job("secretive", 'echo "key ${#WANDB_API_KEY} token ${#HF_TOKEN} project $WANDB_PROJECT"',
                               env={"WANDB_API_KEY": key, "WANDB_PROJECT": "demo"}), start=False)
    handle.free_address()  # the worker runs, and has taken the request's secrets
    handle.start({"HF_TOKEN": token})
    assert handle.wait(timeout=TIMEOUT) == JobStatus.SUCCEEDED
    assert handle.logs() == f"key {len(key)} token {len(token)} project demo\n"
    folder = handle.folder
    holding = [name for name in os.listdir(folder)
               if key.encode() in open(os.path.join(folder, name), "rb").read()
               or token.encode() in open(os.path.join(folder, name), "rb").read()]
    assert holding == [] and "WANDB_PROJECT" in open(os.path.join(folder, "request.json")).read()


def test_terminate_sends_sigterm_to_the_command_and_stops_the_job(client, tmp_path):
    marker = tmp_path / "terminated"
    handle = client.submit(python_job("terminated", TRAPPING, env={"MARKER": str(marker)}))
    wait_for_output(handle, "ready")
    handle.terminate()
    assert handle.status() == JobStatus.STOPPED
    assert (handle.exit_code(), marker.exists()) == (75, True), handle.logs()


def test_terminate_a_held_job_that_never_started(client):
    handle = client.submit(job("never-started", "echo should not run"), start=False)
    handle.free_address()
    handle.release()
    assert handle.status() == JobStatus.STOPPED


def test_scancel_batch_signal_term_reaches_the_command(client, tmp_path):
    """The documented preemption command: `scancel --batch --signal=TERM JOB`."""
    marker = tmp_path / "signalled"
    handle = client.submit(python_job("signalled", TRAPPING, env={"MARKER": str(marker)}))
    wait_for_output(handle, "ready")
    subprocess.run(["scancel", "--batch", "--signal=TERM", handle.job_id], check=True, timeout=30)
    assert handle.wait(timeout=TIMEOUT) == JobStatus.FAILED
    assert handle.exit_code() == 75 and marker.exists()
    assert "got TERM" in handle.logs()


# A job past its time limit (TIMEOUT -> TIMED_OUT, its log kept) is tested once, through iris, in
# lib/marin/tests/test_steps_through_iris_failures.py: Slurm's shortest limit costs over a minute of waiting.


def square(x: int) -> int:
    return x * x


def refuse(message: str) -> None:
    raise ValueError(message)


def test_remote_returns_the_value(client):
    assert client.remote(square, 7, resources=SMALL).result(timeout=TIMEOUT) == 49


def test_remote_raises_the_functions_exception(client):
    future = client.remote(refuse, "no such tokenizer", resources=SMALL)
    with pytest.raises(ValueError, match="no such tokenizer"):
        future.result(timeout=TIMEOUT)


def test_map_returns_results_in_order(client):
    seen = []
    assert client.map(square, [1, 2, 3], resources=SMALL, on_result=lambda i, r: seen.append(i)) == [1, 4, 9]
    assert sorted(seen) == [0, 1, 2]


def test_actors_are_refused_with_what_to_use_instead(client):
    with pytest.raises(SlurmActorsUnsupported, match="free_address"):
        client.create_actor(dict)


def test_check_fits_names_the_known_partitions(slurm_cluster, tmp_path):
    client = SlurmClient("gpu-big", job_root=str(tmp_path))
    with pytest.raises(UnschedulableError, match=rf"no partition 'gpu-big' \(its partitions: {slurm_cluster.partition}\)"):
        client.submit(job("nowhere", "true"))
    assert not (tmp_path).exists() or not os.listdir(tmp_path)  # refused before anything was written


def test_check_fits_refuses_a_gpu_type_no_partition_has(client):
    with pytest.raises(UnschedulableError, match="has 2 x H100 GPU; GPUs of the cluster: none"):
        client.check_fits(ResourceConfig.with_gpu("H100", 2), what="training")


def test_check_fits_refuses_more_cpus_than_any_node(client, slurm_cluster):
    with pytest.raises(UnschedulableError, match=rf"no node of partition 'debug' has {slurm_cluster.cpus + 1} CPUs "
                                                 rf"\(the most: {slurm_cluster.cpus}\)"):
        client.check_fits(ResourceConfig.with_cpu(cpu=slurm_cluster.cpus + 1))
    with pytest.raises(UnschedulableError, match="MiB of memory"):
        client.check_fits(ResourceConfig.with_cpu(ram=f"{slurm_cluster.memory_mib + 1}m"))
    client.check_fits(ResourceConfig.with_cpu(cpu=slurm_cluster.cpus, ram=f"{slurm_cluster.memory_mib}m"))


def test_gpu_jobs_land_on_a_node_with_that_gpu_type(tmp_path):
    # A second private cluster, whose node declares two stand-in T4s (it starts in about a second).
    with LocalSlurmCluster(gpus={"t4": 2}) as cluster:
        client = SlurmClient(job_root=str(tmp_path), poll_interval_s=0.2)
        gpu = ResourceConfig.with_gpu("T4", 1, ram="64m")  # the cluster spells it t4
        handle = client.submit(JobRequest("gpu", ["bash", "-c", "echo gpus=$SLURM_GPUS_ON_NODE"], resources=gpu))
        assert handle.wait(timeout=TIMEOUT) == JobStatus.SUCCEEDED
        assert handle.logs() == "gpus=1\n"
        with open(os.path.join(handle.folder, "job.sh")) as script:
            assert "#SBATCH --gres=gpu:t4:1\n" in script.read()
        with pytest.raises(UnschedulableError, match=f"no node of partition '{cluster.partition}' has 3 x t4 GPU"):
            client.check_fits(ResourceConfig.with_gpu("t4", 3))
        with pytest.raises(UnschedulableError, match=r"has 1 x H100 GPU; GPUs of the cluster: t4 x 2 in 'debug'"):
            client.check_fits(ResourceConfig.with_gpu("H100", 1))


def test_tpus_are_refused(client):
    with pytest.raises(UnschedulableError, match="no TPUs"):
        client.check_fits(ResourceConfig.with_tpu("v4-8"))


def test_sbatch_options_of_a_gpu_request_with_a_time_limit(tmp_path):
    client = SlurmClient("gpu", account="lab", qos="high", job_root=str(tmp_path), sbatch_options=["--exclusive"],
                         check_resources=False)
    request = JobRequest("train", ["true"], resources=ResourceConfig.with_gpu("H100", 8, cpu=12.5, ram="1.5g"),
                         time_limit_s=3601)
    options = client.sbatch_header(request, "/jobs/train", gpu_type="h100")
    assert {"--cpus-per-task=13", "--mem=1536M", "--no-requeue", "--gres=gpu:h100:8", "--time=61",
            "--signal=B:TERM@120", "--partition=gpu", "--account=lab", "--qos=high", "--exclusive"} <= set(options)
    auto = JobRequest("train", ["true"], resources=ResourceConfig.with_gpu("auto", 2))
    assert "--gres=gpu:2" in client.sbatch_header(auto, "/jobs/train", gpu_type=None)


def test_a_url_job_root_is_refused():
    with pytest.raises(SlurmJobRootError, match="folder the submitting machine and the nodes both mount"):
        SlurmClient(job_root="gs://bucket/jobs")


def test_an_unreachable_controller_is_one_line_within_seconds(slurm_cluster, tmp_path, monkeypatch):
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    conf = slurm_cluster.conf_path.read_text()
    conf = re.sub(r"^SlurmctldPort=\d+", f"SlurmctldPort={ports[0]}", conf, flags=re.M)
    conf = re.sub(r"^SlurmdPort=\d+", f"SlurmdPort={ports[1]}", conf, flags=re.M)
    dead = tmp_path / "slurm.conf"
    dead.write_text(conf)
    monkeypatch.setenv("SLURM_CONF", str(dead))
    client = SlurmClient(job_root=str(tmp_path / "jobs"), command_timeout_s=10)
    began = time.monotonic()
    with pytest.raises(SlurmUnavailableError) as raised:
        client.submit(job("unreachable", "true"))
    assert time.monotonic() - began < 15
    assert len(str(raised.value).splitlines()) == 1 and "controller" in str(raised.value)


def test_slurm_settings_make_slurm_clients(slurm_cluster):
    client = client_from_spec("slurm")
    assert isinstance(client, SlurmClient) and client.partition is None
    client = client_from_spec("slurm:debug")
    assert isinstance(client, SlurmClient) and client.partition == "debug"


def submit_from_inside_a_job(job_root: str) -> int:
    # Runs as a Slurm job, whose environment holds the SLURM_* variables of its own allocation.
    assert os.environ.get("SLURM_JOB_ID")
    return SlurmClient(job_root=job_root, poll_interval_s=0.2).remote(square, 5, resources=SMALL).result(timeout=TIMEOUT)


def test_a_job_can_submit_jobs_of_its_own(client):
    assert client.remote(submit_from_inside_a_job, client.job_root, resources=SMALL).result(timeout=2 * TIMEOUT) == 25


def test_a_job_submitted_after_the_last_refresh_is_not_taken_for_forgotten(slurm_cluster, tmp_path):
    # One squeue call a minute for every job of the client: the second job is newer than that answer.
    client = SlurmClient(job_root=str(tmp_path), poll_interval_s=60)
    first = client.submit(job("first", "sleep 2"))
    assert first.status() in (JobStatus.PENDING, JobStatus.RUNNING)
    second = client.submit(job("second", "sleep 4"))  # outlasts the wait for a forgotten job's exit code
    assert second.status() in (JobStatus.PENDING, JobStatus.RUNNING)
    assert (first.wait(timeout=TIMEOUT), second.wait(timeout=TIMEOUT)) == (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED)
