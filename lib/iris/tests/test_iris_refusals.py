"""What iris refuses or explains instead of doing harm: unsafe job names, a damaged database,
and a coordinator that listens wider than the job needs."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap

import pytest

from iris import InvalidJobSpec, JobSpec, JobState, JobStore
from iris.jobs import read_logs, stop_job, submit_job, wait_for_job
from iris.spec import default_job_name
from iris.store import IrisHomeError

TIMEOUT = 60


@pytest.fixture()
def store(tmp_path):
    store = JobStore(tmp_path / "home" / "iris")
    yield store
    for record in store.all():
        if not record.state.finished:
            stop_job(record.job_id, store, timeout=15)


def _cli(home, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "iris.cli", "--home", str(home), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)


def _everything_under(folder) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


@pytest.mark.parametrize(
    "name", ["../../x", "../escape", "/abs/path", "a//b", "a/./b", "has space", "semi;colon", ".hidden", "x" * 300]
)
def test_unsafe_job_names_are_refused_by_the_api(name):
    with pytest.raises(InvalidJobSpec, match="name"):
        JobSpec(name=name, command=("true",))


def test_job_names_like_step_names_are_accepted():
    for name in ("train", "team/llama-nano_v1.2", "a" * 150):
        assert JobSpec(name=name, command=("true",)).name == name


def test_a_name_that_climbs_out_of_iris_home_is_refused_by_the_cli_and_writes_nothing_outside(tmp_path):
    home = tmp_path / "home" / "iris"
    before = _everything_under(tmp_path)
    result = _cli(home, "job", "run", "--name", "../../x", "--", "true")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "'../../x'" in result.stderr and "--name" in result.stderr
    created_outside = {p for p in _everything_under(tmp_path) - before if not p.startswith("home")}
    assert created_outside == set()


def test_the_default_job_name_is_made_safe_from_the_command(store):
    job_id = submit_job(JobSpec(name=default_job_name(["./my script.sh"]), command=("true",)), store)
    assert job_id.startswith("my-script.sh-")
    assert wait_for_job(job_id, store, timeout=TIMEOUT).state == JobState.SUCCEEDED


def test_a_corrupt_job_database_names_the_file_and_what_to_do(tmp_path):
    home = tmp_path / "iris"
    home.mkdir()
    (home / "jobs.db").write_bytes(b"this is not an SQLite database, just some bytes" * 100)
    with pytest.raises(IrisHomeError) as caught:
        JobStore(home)
    message = str(caught.value)
    assert str(home / "jobs.db") in message
    assert "move it aside" in message.lower()

    result = _cli(home, "job", "list")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and str(home / "jobs.db") in result.stderr


def test_local_replicas_get_a_loopback_coordinator_and_bind_address(store):
    script = 'echo "c=$IRIS_COORDINATOR_ADDRESS b=$JAX_COORDINATOR_BIND_ADDRESS"'
    job_id = submit_job(JobSpec(name="addr", command=("sh", "-c", script), replicas=2), store)
    record = wait_for_job(job_id, store, timeout=TIMEOUT)
    assert record.state == JobState.SUCCEEDED, read_logs(job_id, store)
    lines = {line for line in read_logs(job_id, store).splitlines() if line.startswith("c=")}
    assert len(lines) == 1, lines
    coordinator, bind = (part.split("=", 1)[1] for part in lines.pop().split())
    assert coordinator.startswith("127.0.0.1:")
    assert bind == coordinator


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the listening sockets from Linux's /proc")
def test_the_jax_coordinator_of_a_local_job_listens_on_loopback_only(store, tmp_path):
    # Replica 0 runs the coordinator; once both have joined, it reports which address listens on the port.
    program = tmp_path / "listen.py"
    program.write_text(textwrap.dedent(
        """
        import ipaddress, os, jax
        address = os.environ["IRIS_COORDINATOR_ADDRESS"]
        jax.distributed.initialize(address, int(os.environ["IRIS_NUM_REPLICAS"]), int(os.environ["IRIS_REPLICA_INDEX"]))
        if jax.process_index() == 0:
            port = int(address.rsplit(":", 1)[1])
            listening = []
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                if not os.path.exists(table):  # no IPv6 here
                    continue
                with open(table) as handle:
                    for row in handle.readlines()[1:]:
                        local, state = row.split()[1], row.split()[3]
                        host, hex_port = local.split(":")
                        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                            # The kernel prints addresses as little-endian 32-bit words.
                            raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
                            listening.append(str(ipaddress.ip_address(raw)))
            print("LISTEN", " ".join(sorted(listening)))
        """
    ))
    env = {"JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    spec = JobSpec(name="listen", command=(sys.executable, str(program)), replicas=2, env=tuple(env.items()))
    job_id = submit_job(spec, store)
    record = wait_for_job(job_id, store, timeout=120)
    logs = read_logs(job_id, store)
    assert record.state == JobState.SUCCEEDED, logs
    (line,) = [line for line in logs.splitlines() if line.startswith("LISTEN")]
    hosts = [ipaddress.ip_address(host) for host in line.split()[1:]]
    # gRPC may listen on an IPv6 socket for an IPv4 address (::ffff:127.0.0.1): loopback all the same.
    loopback = [host.is_loopback or bool(getattr(host, "ipv4_mapped", None) and host.ipv4_mapped.is_loopback)
                for host in hosts]
    assert hosts and all(loopback), f"the coordinator listens on {[str(host) for host in hosts]}"
