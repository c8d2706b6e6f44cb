"""A private single-node Slurm on this machine: ``munged``, ``slurmctld`` and ``slurmd`` as child processes.

For tests of :class:`fray.cluster.slurm_client.SlurmClient` and for trying Slurm on one machine.
Everything lives in one temporary folder: a ``slurm.conf`` with free ports for the controller
and the node daemon, a fresh munge key and a munge daemon with its own socket (``AuthInfo=socket=``),
so neither the machine's own munge nor another Slurm on it is touched. The node is this machine
(``hostname -s``) with its CPUs and memory, in one partition (``debug`` by default); process
tracking is ``proctrack/linuxproc`` and there is no accounting (no ``slurmdbd``), like a bare
Slurm. Finished jobs stay visible to ``scontrol show job`` for ``MinJobAge`` (an hour).

Clients find it through ``SLURM_CONF``: :attr:`LocalSlurmCluster.env` holds it, and
:meth:`LocalSlurmCluster.start` sets it in this process (restored by :meth:`stop`).

Needs Debian's ``slurm-wlm`` and ``munge`` (``scripts/install_slurm.sh``) and root: the daemons
run the jobs as their submitting user, which only root may do. Linux only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from fray.errors import FrayError

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENT_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")


class SlurmClusterError(FrayError, RuntimeError):
    """A local Slurm that could not start (the daemon's log is in the message)."""


def missing_slurm() -> str | None:
    """Why a local Slurm cannot start here, or ``None`` when it can."""
    absent = [name for name in (*DAEMONS, *CLIENT_COMMANDS) if _which(name) is None]
    if absent:
        return (f"Slurm is not installed here ({', '.join(absent)} missing): run scripts/install_slurm.sh as root "
                "(apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        return "a local Slurm needs root: its daemons run jobs as the submitting user"
    return None


def _which(name: str) -> str | None:
    # The daemons live in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _memory_mib() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise SlurmClusterError("cannot read MemTotal from /proc/meminfo")


class LocalSlurmCluster:
    """A single-node Slurm; use as a context manager, or call :meth:`start` and :meth:`stop`.

    ``cpus`` and ``memory_mib`` default to the machine's (memory a little under its total, since
    ``slurmd`` drains a node that reports less than configured). ``kill_wait_s`` is Slurm's
    ``KillWait``: how long a job has between SIGTERM and SIGKILL at its time limit or cancel.
    ``gpus`` (``{"t4": 2}``) declares GPUs of those types on the node, with empty files standing in
    for the devices: Slurm places ``--gres=gpu:...`` jobs on them, for testing placement without a GPU.
    """

    def __init__(self, *, partition: str = "debug", cpus: int | None = None, memory_mib: int | None = None,
                 kill_wait_s: int = 5, min_job_age_s: int = 3600, gpus: Mapping[str, int] | None = None) -> None:
        self.partition = partition
        self.gpus = dict(gpus or {})
        self.node_name = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.memory_mib = memory_mib or int(_memory_mib() * 0.9)
        self.kill_wait_s = kill_wait_s
        self.min_job_age_s = min_job_age_s
        # Short, directly under the system's temporary folder: unix socket paths may not exceed 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="slurm-"))
        self.conf_path = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge.socket"
        self.controller_port = _free_port()
        self.node_port = _free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self.startup_s: float | None = None
        self._saved_slurm_conf: str | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf_path)}

    # -- configuration ------------------------------------------------------------------------------

    def slurm_conf(self) -> str:
        state = self.root / "state"
        spool = self.root / "spool"
        lines = [
            "ClusterName=fray-local",
            f"SlurmctldHost={self.node_name}(127.0.0.1)",
            f"SlurmctldPort={self.controller_port}",
            f"SlurmdPort={self.node_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root" if os.geteuid() == 0 else f"SlurmUser={os.environ.get('USER', 'root')}",
            "SlurmdUser=root",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'slurmd.log'}",
            # No cgroups: the simplest tracking and task plugins, which run anywhere (containers included).
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            # Schedule a batch job as soon as it arrives (Slurm's default may wait 3 s to batch them up):
            # the median submit-to-start of a tiny job goes from 2.8 s to about 1 s.
            "SchedulerParameters=batch_sched_delay=0",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "ReturnToService=2",
            f"MinJobAge={self.min_job_age_s}",
            f"KillWait={self.kill_wait_s}",
            "InactiveLimit=0",
            "SlurmdTimeout=300",
            "SlurmctldTimeout=120",
            # A node whose hardware differs from this file (a container's view of CPUs) is taken as written.
            "SlurmdParameters=config_overrides",
            f"NodeName={self.node_name} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mib}"
            + (f" Gres={','.join(f'gpu:{kind}:{count}' for kind, count in self.gpus.items())}" if self.gpus else "")
            + " State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node_name} Default=YES MaxTime=INFINITE State=UP",
        ]
        for folder in (state, spool):
            folder.mkdir(exist_ok=True)
        if self.gpus:
            lines.insert(0, "GresTypes=gpu")
            self._write_gres_conf()
        return "\n".join(lines) + "\n"

    def _write_gres_conf(self) -> None:
        # slurmd reads gres.conf beside slurm.conf; each GPU needs a device file, which any file stands in for.
        rows = []
        for kind, count in self.gpus.items():
            files = []
            for index in range(count):
                device = self.root / f"fake-gpu-{kind}-{index}"
                device.touch()
                files.append(str(device))
            rows.append(f"NodeName={self.node_name} Name=gpu Type={kind} File={','.join(files)}")
        (self.root / "gres.conf").write_text("\n".join(rows) + "\n")

    # -- starting -------------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> Self:
        """Start munge, the controller and the node daemon; return once ``sinfo`` shows the node idle."""
        reason = missing_slurm()
        if reason is not None:
            raise SlurmClusterError(reason)
        began = time.monotonic()
        deadline = began + timeout
        self.conf_path.write_text(self.slurm_conf())
        key = self.root / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        try:
            self._spawn("munged", [
                _which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                f"--seed-file={self.root / 'munged.seed'}",
            ])
            self._wait_for(lambda: self.munge_socket.exists(), "munged", deadline)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-c", "-f", str(self.conf_path)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf_path), "-N", self.node_name])
            self._wait_for(self._node_idle, "slurmd", deadline)
        except BaseException:
            self.stop()
            raise
        self._saved_slurm_conf = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(self.conf_path)
        self.startup_s = time.monotonic() - began
        return self

    def _spawn(self, name: str, command: list[str]) -> None:
        output = open(self.root / f"{name}.out", "wb")
        with output:
            self.processes[name] = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                                    env={**os.environ, **self.env}, start_new_session=True,
                                                    cwd=self.root)

    def _wait_for(self, ready, what: str, deadline: float) -> None:
        while not ready():
            dead = [name for name, process in self.processes.items() if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                name = dead[0] if dead else what
                why = f"exited with {self.processes[name].returncode}" if dead else "was not ready in time"
                raise SlurmClusterError(f"local Slurm: {name} {why}; its log:\n{self.log(name)[-4000:]}")
            time.sleep(0.2)

    def _node_idle(self) -> bool:
        try:
            result = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=5,
                                    env={**os.environ, **self.env})
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0 and result.stdout.strip() == "idle"

    def log(self, name: str) -> str:
        """What daemon ``name`` wrote (its log file and its own output)."""
        text = ""
        for path in (self.root / f"{name}.log", self.root / f"{name}.out"):
            if path.exists():
                text += path.read_text(errors="replace")
        return text

    # -- stopping -------------------------------------------------------------------------------

    def stop(self, grace: float = 10.0) -> None:
        """Cancel the jobs still there, stop the daemons (node, controller, munge; SIGTERM, then SIGKILL
        after ``grace``) and remove the folder."""
        if self.processes.get("slurmctld") is not None and self.processes["slurmctld"].poll() is None:
            self._cancel_jobs(grace)
        for name in reversed(DAEMONS):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        if os.environ.get("SLURM_CONF") == str(self.conf_path):
            if self._saved_slurm_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._saved_slurm_conf
        shutil.rmtree(self.root, ignore_errors=True)

    def _cancel_jobs(self, grace: float) -> None:
        # A job's processes belong to slurmstepd, not to slurmd: stopping the daemons would leave them running.
        env = {**os.environ, **self.env}
        try:
            subprocess.run(["scancel", f"--partition={self.partition}"], env=env, capture_output=True, timeout=10)
            deadline = time.monotonic() + grace + self.kill_wait_s
            while time.monotonic() < deadline:
                queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=10)
                if queue.returncode != 0 or not queue.stdout.strip():
                    return
                time.sleep(0.2)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> Self:
        if not self.processes:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
