"""LocalClient: remote functions in threads and in processes, actors, jobs, and choosing a client."""

import os
import sys
import threading

import pytest

from fray.cluster import (
    ClusterConfigError,
    DistributedClient,
    InvalidJobRequest,
    JobRequest,
    JobStatus,
    LocalClient,
    ResourceConfig,
    client_from_spec,
    current_client,
    ship_by_value,
    use_client,
)

# Worker processes cannot import this test file by name; send its classes with their code.
ship_by_value(__name__)


class Counter:
    def __init__(self, start):
        self.value = start
        self.pid = os.getpid()

    def add(self, amount):
        self.value += amount
        return self.value

    def where(self):
        return self.pid

    def fail(self):
        raise KeyError("no such key")


@pytest.fixture(scope="module")
def thread_client():
    client = LocalClient()
    yield client
    client.shutdown()


@pytest.fixture(scope="module")
def process_client():
    client = LocalClient(processes=True, max_workers=2)
    yield client
    client.shutdown()


def test_clients_satisfy_the_protocol(thread_client):
    assert isinstance(thread_client, DistributedClient)


def test_thread_client_runs_functions_in_this_process(thread_client):
    future = thread_client.remote(lambda x, y=1: (x + y, os.getpid(), threading.current_thread().name), 2, y=3)
    value, pid, thread = future.result(timeout=10)
    assert value == 5 and pid == os.getpid() and thread.startswith("fray-local")


def test_process_client_runs_closures_in_another_process(process_client):
    offset = 40  # captured by the lambda: only cloudpickle can ship this

    futures = [process_client.remote(lambda x: (x + offset, os.getpid()), i, resources=ResourceConfig.with_cpu()) for i in range(3)]
    results = [f.result(timeout=60) for f in futures]
    assert [r[0] for r in results] == [40, 41, 42]
    assert all(pid != os.getpid() for _, pid in results)


def test_process_client_reraises_the_functions_exception(process_client):
    def broken():
        raise ValueError("bad input 7")

    with pytest.raises(ValueError, match="bad input 7"):
        process_client.remote(broken).result(timeout=60)


@pytest.mark.parametrize("client_name", ["thread_client", "process_client"])
def test_actor_keeps_state_and_runs_calls_in_order(client_name, request):
    client = request.getfixturevalue(client_name)
    actor = client.create_actor(Counter, 10)
    futures = [actor.add.remote(i) for i in range(1, 6)]
    assert [f.result(timeout=60) for f in futures] == [11, 13, 16, 20, 25]
    in_this_process = actor.where.remote().result(timeout=60) == os.getpid()
    assert in_this_process == (client_name == "thread_client")
    with pytest.raises(KeyError, match="no such key"):
        actor.fail.remote().result(timeout=60)
    assert actor.add.remote(0).result(timeout=60) == 25  # an error in one call keeps the state
    with pytest.raises(TypeError, match=r"\.remote"):
        actor.add(1)
    actor.terminate()


def test_command_job_succeeds_and_keeps_its_logs(thread_client):
    job = thread_client.submit(JobRequest("echo", [sys.executable, "-c", "import os; print('hello', os.environ['GREETING'])"], env={"GREETING": "fray"}))
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    assert "hello fray" in job.logs()


def test_callable_job_failure_shows_the_traceback(thread_client):
    def crash(code):
        print("about to fail")
        raise RuntimeError(f"crash code {code}")

    job = thread_client.submit(JobRequest("crash", crash, args=(3,)))
    assert job.wait(timeout=60) == JobStatus.FAILED
    logs = job.logs()
    assert "about to fail" in logs and "RuntimeError: crash code 3" in logs


def test_terminated_job_is_stopped(thread_client):
    job = thread_client.submit(JobRequest("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"]))
    assert job.status() == JobStatus.RUNNING
    job.terminate()
    assert job.wait(timeout=10) == JobStatus.STOPPED


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: JobRequest("x", "python train.py"), "list of arguments"),
        (lambda: JobRequest("x", []), "non-empty list"),
        (lambda: JobRequest("", ["ls"]), "non-empty name"),
        (lambda: JobRequest("x", ["ls"], args=(1,)), "args and kwargs apply to callables"),
    ],
)
def test_invalid_job_requests_are_refused(make, message):
    with pytest.raises(InvalidJobRequest, match=message):
        make()


def test_client_choice_explicit_then_configuration_then_local(monkeypatch):
    monkeypatch.delenv("MARIN_CLUSTER", raising=False)
    default = current_client()
    assert isinstance(default, LocalClient) and not default.processes

    monkeypatch.setenv("MARIN_CLUSTER", "local:processes")
    configured = current_client()
    assert isinstance(configured, LocalClient) and configured.processes

    explicit = LocalClient()
    with use_client(explicit):
        assert current_client() is explicit
    assert current_client() is configured


def test_cluster_setting_from_marin_yaml(monkeypatch, tmp_path):
    monkeypatch.delenv("MARIN_CLUSTER", raising=False)
    (tmp_path / "marin.yaml").write_text("cluster: ray:auto\n")
    monkeypatch.chdir(tmp_path)
    client = current_client()
    assert type(client).__name__ == "RayClient" and client.address == "auto"


def test_cluster_settings_name_their_backend():
    assert client_from_spec("ray://head:10001").address == "ray://head:10001"
    assert client_from_spec("ray:local").address is None
    with pytest.raises(ClusterConfigError, match="Unknown cluster setting 'kubernetes'.*ray:auto.*slurm:PARTITION"):
        client_from_spec("kubernetes")


# -- map on warm worker processes ----------------------------------------------------------------


def _pid_after_marking(folder):
    def task(index):
        # A worker's first task for this folder dies; the retry, in a new pool, finds the mark.
        mark = os.path.join(folder, "died-once")
        if index == 0 and not os.path.exists(mark):
            open(mark, "w").close()
            os._exit(3)
        return index, os.getpid()

    return task


def test_map_calls_share_warm_workers_that_stop_when_idle():
    import time

    client = LocalClient(processes=True, max_workers=2)
    try:
        client._map_pool.idle_s = 0.3
        first = {pid for _, pid in client.map(lambda i: (i, os.getpid()), range(6))}
        second = {pid for _, pid in client.map(lambda i: (i, os.getpid()), range(6))}
        assert os.getpid() not in first
        assert first & second  # the second call ran on workers the first one started
        deadline = time.monotonic() + 30
        while client._map_pool.worker_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client._map_pool.worker_pids() == set()
        # A call after the idle stop starts new workers.
        assert client.map(lambda i: i * 2, range(3)) == [0, 2, 4]
    finally:
        client.shutdown()


def test_map_retries_a_task_whose_worker_died_on_a_new_pool(tmp_path):
    client = LocalClient(processes=True, max_workers=2)
    try:
        results = client.map(_pid_after_marking(str(tmp_path)), range(4), max_retries=1)
        assert [index for index, _ in results] == [0, 1, 2, 3]
        assert (tmp_path / "died-once").exists()
    finally:
        client.shutdown()


def test_a_large_function_travels_as_a_file_that_is_removed_afterwards(monkeypatch, tmp_path):
    import tempfile

    from fray.cluster import worker_pool

    monkeypatch.setattr(worker_pool, "INLINE_FUNCTION_BYTES", 1024)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    removed = []
    unlink = os.unlink
    monkeypatch.setattr(worker_pool.os, "unlink", lambda path: (removed.append(path), unlink(path)))
    table = bytes(range(256)) * 64  # 16 KiB held by the function
    client = LocalClient(processes=True, max_workers=2)
    try:
        assert client.map(lambda i: table[i] + len(table), range(3)) == [16384, 16385, 16386]
    finally:
        client.shutdown()
    assert len(removed) == 1 and os.path.dirname(removed[0]) == str(tmp_path)
    assert list(tmp_path.glob("fray-map-*")) == []


def test_a_failing_map_call_leaves_a_call_sharing_its_workers_running():
    import concurrent.futures as cf
    import time

    def slow(i):
        time.sleep(0.5)
        return i

    def broken(i):
        raise ValueError(f"bad item {i}")

    client = LocalClient(processes=True, max_workers=3)
    try:
        with cf.ThreadPoolExecutor(2) as threads:
            survivor = threads.submit(client.map, slow, range(4))
            time.sleep(0.2)  # the slow call is in flight when the other fails
            with pytest.raises(ValueError, match="bad item"):
                client.map(broken, range(2))
            assert survivor.result(timeout=60) == [0, 1, 2, 3]
    finally:
        client.shutdown()


def test_workers_see_the_environment_and_directory_of_the_call_not_of_their_start(monkeypatch, tmp_path):
    monkeypatch.delenv("FRAY_TEST_SETTING", raising=False)
    client = LocalClient(processes=True, max_workers=2)
    try:
        def probe(_):
            return os.environ.get("FRAY_TEST_SETTING"), os.getcwd()

        assert client.map(probe, range(2)) == [(None, os.getcwd())] * 2
        monkeypatch.setenv("FRAY_TEST_SETTING", "credentials-for-step-2")
        monkeypatch.chdir(tmp_path)
        assert client.map(probe, range(2)) == [("credentials-for-step-2", str(tmp_path))] * 2
    finally:
        client.shutdown()


def test_workers_split_the_cores_between_their_rust_thread_pools(monkeypatch):
    # One rayon thread per core in every worker would put workers x cores threads on the cores; each
    # worker gets its share, and a setting the user made is left as it is.
    from fray.cluster.worker_pool import available_cpus

    def rayon_threads(_):
        return os.environ.get("RAYON_NUM_THREADS")

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    client = LocalClient(processes=True, max_workers=2)
    try:
        assert client.map(rayon_threads, range(2)) == [str(max(1, available_cpus() // 2))] * 2
        assert "RAYON_NUM_THREADS" not in os.environ  # set in the workers only: this process keeps every core
        monkeypatch.setenv("RAYON_NUM_THREADS", "3")
        assert client.map(rayon_threads, range(2)) == ["3"] * 2
    finally:
        client.shutdown()


ORPHAN_DRIVER = """
import os, pathlib, sys, time
from fray.cluster import LocalClient

def hold(index):
    pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
    time.sleep(120)  # a long shard: far longer than the test waits
    return index

if __name__ == "__main__":
    LocalClient(processes=True, max_workers=1).map(hold, [0])
"""


def test_a_worker_whose_driver_was_killed_stops_within_seconds_not_after_its_task(tmp_path):
    import signal
    import subprocess
    import time

    (tmp_path / "driver.py").write_text(ORPHAN_DRIVER)
    pid_file = tmp_path / "worker.pid"
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(pid_file)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert driver.poll() is None and time.monotonic() < deadline, "the worker never started its task"
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        driver.send_signal(signal.SIGKILL)  # no chance to stop its pool
        driver.wait(timeout=30)
        deadline = time.monotonic() + 20  # the worker checks its parent every second
        while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = os.path.exists(f"/proc/{worker}")
        if alive:
            os.kill(worker, signal.SIGKILL)
        assert not alive, "the orphaned worker was still running its task 20 s after its driver died"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
