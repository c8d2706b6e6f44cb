"""Ray nodes as processes of this machine, started with the ``ray`` CLI: a real multi-node cluster on one host.

Each node is one ``ray start --block`` process, in a session of its own, with its own temporary
folder and its own ports, so that several nodes (and other people's Ray instances on a shared
machine) live side by side. Nothing is shared between the nodes but the head's address, exactly as
on separate machines: work placed on a node runs in that node's worker processes, with that node's
environment variables.

Stopping touches only the processes a :class:`LocalRayCluster` started (never ``ray stop``, which
ends every Ray instance of the machine): the ``ray start`` process of each node and every process
below it (raylet, GCS, agents, workers), found through ``/proc`` before any signal is sent.
:meth:`LocalRayCluster.kill` ends one node at once with SIGKILL, as a machine that dies would.

The cluster uses Ray's token authentication with a token of its own; :attr:`LocalRayCluster.driver_env`
holds the variables a driver process needs to connect (``RAY_ADDRESS`` and the token).

With ``start_head(autoscaler=FakeAutoscaler(...))`` the head runs Ray's own autoscaler, as on a
``ray up`` cluster, over Ray's fake multi-node provider: the worker groups it adds and removes are
Ray nodes of this machine too (processes below the head's monitor, stopped with the head).

Linux only (it reads ``/proc``); meant for tests and for trying a multi-node set-up on one machine.
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from fray.errors import FrayError

# The lines `ray start` prints once the node is registered with the cluster (and, with --block,
# right before it starts waiting).
_STARTED = "Ray runtime started"
# Worker processes of a node get ports from a range of their own, claimed machine-wide (a lock file
# held while the cluster lives), so that clusters started at once by several processes never share
# one. Ray's default range, 10002-19999, is left to other Ray instances of the machine, and the
# ranges end below 32768, where the system's ephemeral ports (and _free_port's) begin.
_WORKER_PORT_BASE = 20000
_WORKER_PORTS_PER_NODE = 100
_WORKER_PORT_RANGES = (32768 - _WORKER_PORT_BASE) // _WORKER_PORTS_PER_NODE


class RayNodeError(FrayError, RuntimeError):
    """A node that did not start (its ``ray start`` output is in the message)."""


class _StartupTimedOut(RayNodeError):
    """``ray start`` gave up waiting for its node to register (Ray's own limit, not ours)."""


_RAY_STARTUP_TIMEOUT = "timed out during startup"
_START_ATTEMPTS = 2


@dataclass
class RayNode:
    """One node: its ``ray start --block`` process, its temporary folder and its output."""

    name: str
    process: subprocess.Popen
    temp_dir: Path
    log_path: Path
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


# The head's node type name and node id Ray's fake provider expects (its FAKE_HEAD_NODE_TYPE).
_FAKE_HEAD_TYPE = "ray.head.default"


@dataclass(frozen=True)
class FakeAutoscaler:
    """Ray's autoscaler on the head, adding nodes of this machine for ``worker_types``.

    ``worker_types`` maps a group's name to what a ``ray up`` file says of it: ``resources``
    (``CPU``, ``memory`` in bytes and custom resources), ``min_workers`` and ``max_workers``. Nodes
    idle for ``idle_timeout_minutes`` are removed; the autoscaler looks every ``update_interval_s``;
    a node whose raylet went silent (a machine taken back) is removed after ``heartbeat_timeout_s``
    (Ray's default, 30 s, is meant for real machines).
    """

    worker_types: Mapping[str, Mapping[str, Any]]
    idle_timeout_minutes: float = 0.1
    update_interval_s: float = 1.0
    heartbeat_timeout_s: int = 10

    def cluster_config(self, gcs_address: str, head_cpus: int, head_resources: Mapping[str, float],
                       object_store_bytes: int) -> dict[str, Any]:
        """The cluster config the head's autoscaler reads (Ray's schema, as ``ray up`` writes it)."""
        types: dict[str, Any] = {
            _FAKE_HEAD_TYPE: {"resources": {"CPU": head_cpus, **head_resources}, "node_config": {}, "max_workers": 0},
        }
        for name, spec in self.worker_types.items():
            resources = {"object_store_memory": object_store_bytes, **dict(spec["resources"])}
            types[name] = {"node_config": {}, "min_workers": 0, **dict(spec), "resources": resources}
        return {
            "cluster_name": "fray-local",
            "max_workers": sum(int(spec.get("max_workers", 1)) for spec in self.worker_types.values()),
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": self.idle_timeout_minutes,
            "provider": {
                "type": "external",
                "module": "fray.cluster.ray_fake_provider.FakeNodesDeclaringMemory",
                "gcs_address": gcs_address,
                # Nodes of this host share its address: the autoscaler tells them apart by node id.
                "use_node_id_as_ip": True,
                # Nothing to set up over SSH: a node is up once its raylet is.
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
            },
            "auth": {"ssh_user": "unused"},
            "head_node_type": _FAKE_HEAD_TYPE,
            "available_node_types": types,
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }

    def head_env(self) -> dict[str, str]:
        return {
            "RAY_FAKE_CLUSTER": "1",  # the fake provider runs only under it
            "AUTOSCALER_UPDATE_INTERVAL_S": f"{self.update_interval_s:g}",
            "AUTOSCALER_HEARTBEAT_TIMEOUT_S": str(int(self.heartbeat_timeout_s)),
        }


class LocalRayCluster:
    """A Ray head and further nodes on this machine; use as a context manager, or call :meth:`stop`.

    ``env`` is added to every node's environment (and so to every worker process of the cluster):
    the place for credentials and endpoints the work needs, such as an object store's.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, object_store_bytes: int = 128 << 20) -> None:
        # Unix socket paths live under each node's temporary folder and may not exceed 107 bytes,
        # so the folder is short and directly under the system's temporary directory.
        self.root = Path(tempfile.mkdtemp(prefix="ray-nodes-"))
        self.env = dict(env or {})
        self.object_store_bytes = object_store_bytes
        self.nodes: dict[str, RayNode] = {}
        self.port: int | None = None
        self._token = secrets.token_hex(16)
        self._started = 0  # nodes started so far, for unique folder names when a node is restarted
        self._port_claims: list = []  # open, locked files: one per range of worker ports in use

    # -- what a driver needs ----------------------------------------------------------------------

    @property
    def address(self) -> str:
        if self.port is None:
            raise RayNodeError("the cluster has no head node yet: call start_head() first")
        return f"127.0.0.1:{self.port}"

    @property
    def driver_env(self) -> dict[str, str]:
        """Variables for a driver process: ``RAY_ADDRESS`` (so ``ray.init(address="auto")`` and
        ``MARIN_CLUSTER=ray:auto`` find this cluster) and the cluster's authentication token."""
        return {"RAY_ADDRESS": self.address, **self._auth_env}

    @property
    def _auth_env(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self._token}

    # -- starting -------------------------------------------------------------------------------

    def start_head(self, name: str = "head", *, cpus: int = 1, resources: Mapping[str, float] | None = None,
                   env: Mapping[str, str] | None = None, timeout: float = 90,
                   autoscaler: FakeAutoscaler | None = None) -> RayNode:
        """Start the head node (GCS and a raylet); the dashboard is off. With ``autoscaler`` the head's
        monitor runs Ray's autoscaler, which adds and removes nodes of its worker groups."""
        if self.port is not None:
            raise RayNodeError("this cluster already has a head node")
        self.port = _free_port()
        args = ["--head", f"--port={self.port}", "--include-dashboard=false", f"--dashboard-port={_free_port()}"]
        if autoscaler is not None:
            config = self.root / "autoscaler.json"
            config.write_text(json.dumps(autoscaler.cluster_config(self.address, cpus, dict(resources or {}),
                                                                   self.object_store_bytes)))
            args.append(f"--autoscaling-config={config}")
            env = {**autoscaler.head_env(), **dict(env or {})}
        return self._start(name, args, cpus, resources, env, timeout)

    def add_node(self, name: str, *, cpus: int = 1, resources: Mapping[str, float] | None = None,
                 env: Mapping[str, str] | None = None, timeout: float = 90) -> RayNode:
        """Start a node that joins the head; returns once the head knows it."""
        return self._start(name, [f"--address={self.address}"], cpus, resources, env, timeout)

    def _start(self, name: str, role_args: list[str], cpus: int, resources: Mapping[str, float] | None,
               env: Mapping[str, str] | None, timeout: float) -> RayNode:
        if name in self.nodes and self.nodes[name].alive:
            raise RayNodeError(f"a node named {name!r} is already running")
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                return self._start_once(name, role_args, cpus, resources, env, timeout)
            except _StartupTimedOut as error:
                # Ray gives a new node a fixed 30 s to register with its head; on a machine busy with
                # other work it can miss that and exit, though nothing is wrong: start it again.
                if attempt == _START_ATTEMPTS:
                    raise RayNodeError(str(error)) from None
        raise AssertionError("unreachable")

    def _start_once(self, name: str, role_args: list[str], cpus: int, resources: Mapping[str, float] | None,
                    env: Mapping[str, str] | None, timeout: float) -> RayNode:
        label = f"{name}-{self._started}"
        self._started += 1
        temp_dir = self.root / label
        temp_dir.mkdir()
        first_port = self._claim_worker_ports()
        command = [
            _ray_cli(), "start", *role_args, "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={cpus}", "--num-gpus=0",
            f"--resources={json.dumps(dict(resources or {}))}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
            # Every port of its own, so that two nodes of one machine never reach for the same.
            f"--node-manager-port={_free_port()}",
            f"--object-manager-port={_free_port()}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--dashboard-agent-grpc-port={_free_port()}",
            f"--runtime-env-agent-port={_free_port()}",
            f"--metrics-export-port={_free_port()}",
            f"--min-worker-port={first_port}",
            f"--max-worker-port={first_port + _WORKER_PORTS_PER_NODE - 1}",
        ]
        node_env = {**os.environ, **self.env, **self._auth_env, **dict(env or {})}
        node_env.pop("RAY_ADDRESS", None)
        if "TPU_LOG_DIR" not in {**self.env, **dict(env or {})}:
            # Ray links a node's logs/tpu_logs to TPU_LOG_DIR, else to the machine's /tmp/tpu_logs, and
            # its log monitor reads every file there and sends each line to the drivers: everything
            # libtpu has logged on this machine, gigabytes where TPU programs were compiled, which kept
            # each node's monitor busy on a core. A node's own folder holds only its workers' logs.
            (temp_dir / "tpu_logs").mkdir()
            node_env["TPU_LOG_DIR"] = str(temp_dir / "tpu_logs")
        log_path = self.root / f"{label}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=node_env,
                                       start_new_session=True, cwd=self.root)
        node = RayNode(name, process, temp_dir, log_path, dict(resources or {}))
        self.nodes[name] = node
        deadline = time.monotonic() + timeout
        while _STARTED not in node.output():
            if not node.alive or time.monotonic() > deadline:
                self._terminate(node, grace=0)
                reason = f"exited with {process.returncode}" if process.returncode is not None else f"not up after {timeout:.0f} s"
                printed = node.output()
                error = _StartupTimedOut if _RAY_STARTUP_TIMEOUT in printed else RayNodeError
                raise error(f"Ray node {name!r} {reason}; `{' '.join(command)}` printed:\n{printed[-4000:]}")
            time.sleep(0.1)
        return node

    # -- stopping -------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """End node ``name`` and all its processes at once (SIGKILL), like a machine that dies."""
        self._terminate(self.nodes[name], grace=0)

    def stop(self, grace: float = 10.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL for what is left after ``grace`` seconds) and
        remove the cluster's temporary folders."""
        # Non-head nodes first, so that none of them spends the grace period retrying a lost head.
        for node in reversed(list(self.nodes.values())):
            self._terminate(node, grace=grace)
        shutil.rmtree(self.root, ignore_errors=True)
        for claim in self._port_claims:
            claim.close()  # closing the file releases its lock
        self._port_claims.clear()

    def _claim_worker_ports(self) -> int:
        """The first port of a range no other cluster of this machine holds; held until stop()."""
        folder = Path(tempfile.gettempdir()) / "fray-ray-worker-ports"
        folder.mkdir(exist_ok=True)
        for index in range(_WORKER_PORT_RANGES):
            claim = open(folder / f"{index}.lock", "w")
            try:
                fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the holder exits, even by SIGKILL
            except BlockingIOError:
                claim.close()
                continue
            self._port_claims.append(claim)
            return _WORKER_PORT_BASE + index * _WORKER_PORTS_PER_NODE
        raise RayNodeError(f"every range of worker ports ({_WORKER_PORT_BASE}-32767) is held by other Ray clusters of this machine")

    def _terminate(self, node: RayNode, *, grace: float) -> None:
        processes = _process_tree(node.process.pid)  # before any signal: orphans lose their parent link
        if grace > 0 and node.alive:
            node.process.send_signal(signal.SIGTERM)
            try:
                node.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        for pid, started in processes:
            if _start_time(pid) == started:  # the same process, not a new one that reused the pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            node.process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
            pass
        deadline = time.monotonic() + 10
        while any(_start_time(pid) == started for pid, started in processes) and time.monotonic() < deadline:
            time.sleep(0.05)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _ray_cli() -> str:
    """The ``ray`` script of this Python environment (so every node runs the same Ray and Python)."""
    beside = Path(sys.executable).with_name("ray")
    if beside.exists():
        return str(beside)
    found = shutil.which("ray")
    if found is None:
        raise RayNodeError("the `ray` command is not installed: `pip install 'marin[ray]'`")
    return found


# The ports _free_port handed out last. A port is free once its probe closes, so the system may give the same
# one to the next probe: a node's command line, which names six or eight of them, then names one twice and Ray
# refuses to start ("trying to use a port number ... that is used by other components").
_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=64)
_RECENT_PORTS_LOCK = threading.Lock()


def _free_port() -> int:
    """A port free on this machine now, and none of the last ones this process handed out."""
    with _RECENT_PORTS_LOCK:
        for _ in range(100):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            if port not in _RECENT_PORTS:
                _RECENT_PORTS.append(port)
                return port
    raise FrayError("could not find a free port that was not just handed out")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; the fields after it do not.
    return text[text.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def _process_tree(root: int) -> list[tuple[int, str]]:
    """``(pid, start time)`` of ``root`` and every process below it, found through ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        started = _start_time(pid)
        if started is not None:
            found.append((pid, started))
        stack.extend(children.get(pid, ()))
    return found
