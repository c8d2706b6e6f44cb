"""LocalRayCluster's own bookkeeping, with a stand-in for ``ray start``: a node that misses Ray's
startup limit is started again, clusters of one machine never share a range of worker ports, and
each node's libtpu logs are its own."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import pytest

from fray.cluster import ray_nodes
from fray.cluster.ray_nodes import LocalRayCluster, RayNodeError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="nodes are process groups with POSIX signals")

# Prints what `ray start --block` prints, after failing as Ray does the first FAILURES times.
FAKE_RAY = """#!{python}
import os, sys, time
count_file = os.environ["FAKE_RAY_COUNT"]
count = int(open(count_file).read()) + 1 if os.path.exists(count_file) else 1
open(count_file, "w").write(str(count))
open(count_file + f".args-{{count}}", "w").write(" ".join(sys.argv[1:]))
open(count_file + f".tpu-log-dir-{{count}}", "w").write(os.environ.get("TPU_LOG_DIR", ""))
if count <= int(os.environ["FAKE_RAY_FAILURES"]):
    print("Exception: The current node timed out during startup. This could happen because ...", flush=True)
    sys.exit(1)
print("Ray runtime started.", flush=True)
time.sleep(60)
"""


@pytest.fixture
def fake_ray(tmp_path, monkeypatch):
    script = tmp_path / "ray"
    script.write_text(FAKE_RAY.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setattr(ray_nodes, "_ray_cli", lambda: str(script))
    monkeypatch.setenv("FAKE_RAY_COUNT", str(tmp_path / "count"))
    # The clusters' folders and their claims on port ranges stay private to the test, so the ranges
    # it sees do not depend on Ray clusters other tests run at the same time.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path / "count"


def _starts(count: Path) -> int:
    return int(count.read_text())


def test_a_node_that_misses_rays_startup_limit_is_started_once_more(fake_ray, monkeypatch):
    monkeypatch.setenv("FAKE_RAY_FAILURES", "1")
    with LocalRayCluster() as cluster:
        node = cluster.start_head(timeout=30)
        assert node.alive and _starts(fake_ray) == 2


def test_a_node_that_misses_it_twice_fails_with_rays_words(fake_ray, monkeypatch):
    monkeypatch.setenv("FAKE_RAY_FAILURES", "2")
    with LocalRayCluster() as cluster, pytest.raises(RayNodeError, match="timed out during startup"):
        cluster.start_head(timeout=30)
    assert _starts(fake_ray) == 2


def test_each_node_gets_a_libtpu_log_folder_of_its_own_unless_its_env_names_one(fake_ray, monkeypatch, tmp_path):
    # Ray's log monitor sends every line under TPU_LOG_DIR (else the machine's /tmp/tpu_logs) to the drivers.
    monkeypatch.setenv("FAKE_RAY_FAILURES", "0")
    monkeypatch.setenv("TPU_LOG_DIR", str(tmp_path / "machine-wide"))
    named = tmp_path / "named"
    with LocalRayCluster() as cluster:
        head = cluster.start_head(timeout=30)
        cluster.add_node("worker", timeout=30, env={"TPU_LOG_DIR": str(named)})
        own = Path(Path(f"{fake_ray}.tpu-log-dir-1").read_text())
        assert own == head.temp_dir / "tpu_logs" and own.is_dir()
        assert Path(f"{fake_ray}.tpu-log-dir-2").read_text() == str(named)


def test_clusters_alive_at_once_get_different_worker_port_ranges_and_free_them_when_stopped(fake_ray, monkeypatch):
    monkeypatch.setenv("FAKE_RAY_FAILURES", "0")

    def worker_ports(start: int) -> tuple[int, int]:
        args = Path(f"{fake_ray}.args-{start}").read_text()
        return tuple(int(re.search(rf"--{side}-worker-port=(\d+)", args).group(1)) for side in ("min", "max"))

    first, second = LocalRayCluster(), LocalRayCluster()
    try:
        first.start_head(timeout=30)
        second.start_head(timeout=30)
        first.add_node("worker", timeout=30)
        ranges = [worker_ports(start) for start in (1, 2, 3)]
        spans = [set(range(low, high + 1)) for low, high in ranges]
        assert all(not a & b for i, a in enumerate(spans) for b in spans[i + 1:]), ranges
        assert all(high < 32768 for _, high in ranges)  # below the system's ephemeral ports
    finally:
        first.stop(grace=1)
        second.stop(grace=1)
    with LocalRayCluster() as third:  # the stopped clusters' ranges are free again
        third.start_head(timeout=30)
        assert worker_ports(4) == ranges[0]


def test_ports_handed_out_one_after_another_are_distinct_even_when_the_system_reuses_one(monkeypatch):
    """A probe's port is free again once the probe closes; were the system to give the same one to the next
    probe, a node's command line would name it twice and Ray would refuse to start."""
    given = iter([41001, 41001, 41001, 41002, 41001, 41003])

    class Probe:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(given)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(ray_nodes.socket, "socket", Probe)
    monkeypatch.setattr(ray_nodes, "_RECENT_PORTS", ray_nodes.collections.deque(maxlen=64))
    assert [ray_nodes._free_port() for _ in range(3)] == [41001, 41002, 41003]
