"""A private single-node Slurm on this machine: ``munged``, ``slurmctld`` and ``slurmd``.

For trying Slurm on one machine (``marin slurm start``) and for the tests of
:class:`fray.cluster.slurm_client.SlurmClient`. Everything lives in one folder, the cluster's state
folder: a ``slurm.conf`` with free ports for the controller and the node daemon, a fresh munge key
and a munge daemon with its own socket (``AuthInfo=socket=``), so neither the machine's own munge
nor another Slurm on it is touched. The node is this machine (``hostname -s``), declaring twice its
cores as CPUs (see ``cpus``) and its memory, in one partition (``debug`` by default); process
tracking is ``proctrack/linuxproc`` and there is no accounting (no ``slurmdbd``), like a bare
Slurm. Finished jobs stay visible to ``scontrol show job`` for ``MinJobAge`` (an hour).

Two ways to hold one. In a process: ``with LocalSlurmCluster() as cluster:`` (a temporary folder,
removed at the end). Across processes: :func:`start_local_slurm` starts one in a state folder
(default ``~/.cache/fray/slurm-local``, or ``FRAY_SLURM_LOCAL_DIR``) whose daemons outlive the
caller, each in a session of its own; their pids are kept in the folder's ``cluster.json``, so
:func:`running_local_slurm` finds them from any process and :func:`stop_local_slurm` ends them. A
recorded pid is signalled only while its command line names the folder: a stale record (after a
reboot, with pids reused) never touches another process.

Clients find it through ``SLURM_CONF``: :attr:`LocalSlurmCluster.env` holds it, the folder's
``env`` file exports it, and :meth:`LocalSlurmCluster.start` sets it in this process (restored by
:meth:`stop`).

Needs Debian's ``slurm-wlm`` and ``munge`` (``scripts/install_slurm.sh``) and root: the daemons
run the jobs as their submitting user, which only root may do. Linux only.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

from rigging.filesystem import atomic_write

from fray.errors import FrayError

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENT_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
STATE_DIR_ENV = "FRAY_SLURM_LOCAL_DIR"
RECORD_NAME = "cluster.json"
ENV_FILE_NAME = "env"
# The longest path a unix socket may have (sun_path is 108 bytes with its terminating NUL).
_SOCKET_PATH_MAX = 107


class SlurmClusterError(FrayError, RuntimeError):
    """A local Slurm that could not start (the daemon's log is in the message), or a state folder it cannot use."""


def missing_slurm() -> str | None:
    """Why a local Slurm cannot start here, or ``None`` when it can."""
    absent = [name for name in (*DAEMONS, *CLIENT_COMMANDS) if _which(name) is None]
    if absent:
        return (f"Slurm is not installed here ({', '.join(absent)} missing): run scripts/install_slurm.sh as root "
                "(apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        return "a local Slurm needs root: its daemons run jobs as the submitting user"
    return None


def state_dir_or_default(state_dir: str | os.PathLike | None = None) -> Path:
    """``state_dir`` made absolute, or the machine's private Slurm's: ``$FRAY_SLURM_LOCAL_DIR``, else
    ``~/.cache/fray/slurm-local``."""
    if state_dir is None:
        state_dir = os.environ.get(STATE_DIR_ENV) or Path.home() / ".cache" / "fray" / "slurm-local"
    return Path(state_dir).absolute()


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


def _is_daemon_of(pid: int, root: Path) -> bool:
    """Whether ``pid`` is a live process (not a zombie) whose command line names ``root``."""
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    # A daemon whose parent exited is reaped by init; until then it stays a zombie, as good as gone.
    return state != "Z" and f"{root}/" in command_line


def _end_process(pid: int, root: Path, grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, for a daemon that is not this process's child."""
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _is_daemon_of(pid, root):
                return
            time.sleep(0.1)


@dataclass(frozen=True)
class LocalSlurmRecord:
    """What a cluster keeps in its folder's ``cluster.json``, for another process to find it again."""

    partition: str
    node_name: str
    cpus: int
    memory_mib: int
    gpus: dict[str, int]
    kill_wait_s: int
    controller_port: int
    node_port: int
    pids: dict[str, int]  # daemon name -> pid, written as each one starts
    ready: bool  # False while starting: sinfo has not shown the node idle yet
    min_job_age_s: int = 3600  # absent from records written before it was kept


class LocalSlurmCluster:
    """A single-node Slurm; use as a context manager, or call :meth:`start` and :meth:`stop`.

    ``cpus`` and ``memory_mib`` default to the machine's (memory a little under its total, since
    ``slurmd`` drains a node that reports less than configured). ``kill_wait_s`` is Slurm's
    ``KillWait``: how long a job has between SIGTERM and SIGKILL at its time limit or cancel.
    ``gpus`` (``{"t4": 2}``) declares GPUs of those types on the node, with empty files standing in
    for the devices: Slurm places ``--gres=gpu:...`` jobs on them, for testing placement without a GPU.
    ``state_dir`` is the cluster's folder (made by :meth:`start`, which refuses one holding anything
    else); by default a new temporary one. :meth:`stop` removes it.
    """

    def __init__(self, *, partition: str = "debug", cpus: int | None = None, memory_mib: int | None = None,
                 kill_wait_s: int = 5, min_job_age_s: int = 3600, gpus: Mapping[str, int] | None = None,
                 state_dir: str | os.PathLike | None = None) -> None:
        self.partition = partition
        self.gpus = dict(gpus or {})
        self.node_name = socket.gethostname().split(".")[0]
        # Twice the cores, at least 4: each step run through iris holds a one-CPU supervisor job beside
        # its replicas (iris.placement), and a supervisor only waits. ``cpus=`` declares what you say.
        self.cpus = cpus or max(4, 2 * (os.cpu_count() or 1))
        self.memory_mib = memory_mib or int(_memory_mib() * 0.9)
        self.kill_wait_s = kill_wait_s
        self.min_job_age_s = min_job_age_s
        # By default short, directly under the system's temporary folder: unix socket paths may not exceed 107 bytes.
        self._temporary = state_dir is None
        self.root = Path(tempfile.mkdtemp(prefix="slurm-")) if state_dir is None else state_dir_or_default(state_dir)
        self.conf_path = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge.socket"
        self.controller_port = _free_port()
        self.node_port = _free_port()
        self.processes: dict[str, subprocess.Popen] = {}  # the daemons this process started (its children)
        self.pids: dict[str, int] = {}  # every daemon's pid, including those another process started
        self.ready = False  # the node was idle once: start() finished
        self.startup_s: float | None = None
        self._saved_slurm_conf: str | None = None

    @classmethod
    def attach(cls, state_dir: str | os.PathLike) -> LocalSlurmCluster | None:
        """The cluster whose ``cluster.json`` is in ``state_dir`` (running or not), or ``None`` when there is none."""
        root = state_dir_or_default(state_dir)
        try:
            record = LocalSlurmRecord(**json.loads((root / RECORD_NAME).read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise SlurmClusterError(f"{root / RECORD_NAME} is not a local Slurm's record ({exc}); end its daemons "
                                    f"by hand if any run, then remove {root}") from None
        cluster = cls(partition=record.partition, cpus=record.cpus, memory_mib=record.memory_mib,
                      kill_wait_s=record.kill_wait_s, min_job_age_s=record.min_job_age_s, gpus=record.gpus, state_dir=root)
        cluster.node_name = record.node_name
        cluster.controller_port, cluster.node_port = record.controller_port, record.node_port
        cluster.pids = dict(record.pids)
        cluster.ready = record.ready
        return cluster

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf_path)}

    @property
    def export_line(self) -> str:
        """The shell line that points a shell's Slurm commands (and marin) at this cluster."""
        return f"export SLURM_CONF={shlex.quote(str(self.conf_path))}"

    @property
    def env_file(self) -> Path:
        """A file holding :attr:`export_line`, for ``source`` in another shell."""
        return self.root / ENV_FILE_NAME

    @property
    def is_running(self) -> bool:
        """Whether its start finished and all three daemons are still alive."""
        return self.ready and not self.stopped_daemons()

    def stopped_daemons(self) -> list[str]:
        """The daemons of this cluster that are not running."""
        return [name for name in DAEMONS if name not in self.pids or not _is_daemon_of(self.pids[name], self.root)]

    def describe(self) -> str:
        """One line for a person: the node, its partition and the controller's port."""
        gpus = "".join(f", {count} x {kind} GPU" for kind, count in self.gpus.items())
        cores = os.cpu_count() or 1
        # More slots than cores is on purpose (see __init__); say so, or `sinfo` reads like a mistake.
        slots = (f"{self.cpus} CPUs declared on {cores} cores, since iris's supervisors are Slurm jobs that only wait"
                 if self.cpus > cores else f"{self.cpus} CPUs")
        return (f"node {self.node_name} ({slots}, {self.memory_mib} MiB{gpus}) in partition "
                f"'{self.partition}', controller on port {self.controller_port}")

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

    def _check_state_dir(self) -> None:
        # slurmd makes a unix socket per job step in its spool folder (NODE_JOBID.STEPID, both up to 10 digits).
        longest = len(str(self.root / "spool" / f"{self.node_name}_{'9' * 10}.{'9' * 10}").encode())
        if longest > _SOCKET_PATH_MAX:
            raise SlurmClusterError(f"the state folder {self.root} is too long for the daemons' unix sockets "
                                    f"({longest} bytes of at most {_SOCKET_PATH_MAX}): choose a shorter folder")
        if (self.root / RECORD_NAME).exists():
            raise SlurmClusterError(f"the state folder {self.root} holds a local Slurm already: stop it first "
                                    "(stop_local_slurm, `marin slurm stop`)")
        if self.root.is_file() or (self.root.is_dir() and any(self.root.iterdir())):
            raise SlurmClusterError(f"the state folder {self.root} is not empty and holds no local Slurm: "
                                    "choose a new or empty folder")

    def _write_record(self) -> None:
        record = LocalSlurmRecord(partition=self.partition, node_name=self.node_name, cpus=self.cpus,
                                  memory_mib=self.memory_mib, gpus=self.gpus, kill_wait_s=self.kill_wait_s,
                                  controller_port=self.controller_port, node_port=self.node_port,
                                  pids=dict(self.pids), ready=self.ready, min_job_age_s=self.min_job_age_s)
        atomic_write(str(self.root / RECORD_NAME), json.dumps(asdict(record), indent=1) + "\n")

    # -- starting -------------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> Self:
        """Start munge, the controller and the node daemon; return once ``sinfo`` shows the node idle.

        The daemons run in sessions of their own and outlive this process unless :meth:`stop` ends them.
        """
        self._check_state_dir()
        reason = missing_slurm()
        if reason is not None:
            if self._temporary:
                self.stop()  # nothing runs yet: removes the empty folder __init__ made
            raise SlurmClusterError(reason)
        began = time.monotonic()
        deadline = began + timeout
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            # Recorded before any daemon starts, so a start cut short leaves a folder stop_local_slurm clears.
            self._write_record()
            self.conf_path.write_text(self.slurm_conf())
            key = self.root / "munge.key"
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o400)
            self._spawn("munged", [
                _which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                f"--seed-file={self.root / 'munged.seed'}",
            ])
            self._wait_for(lambda: self.munge_socket.exists(), "munged", deadline)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-c", "-f", str(self.conf_path)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf_path), "-N", self.node_name])
            self._wait_for(self._node_idle, "slurmd", deadline)
            self.ready = True
            self._write_record()
            atomic_write(str(self.env_file), self.export_line + "\n")
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
            # A session of its own and no terminal input: the daemon outlives the command that started it,
            # and Ctrl-C in that command's shell does not reach it.
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       env={**os.environ, **self.env}, start_new_session=True, cwd=self.root)
        self.processes[name] = process
        self.pids[name] = process.pid
        self._write_record()  # from here on, a stop from another process finds this daemon too

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
        after ``grace``) and remove the folder. Stopping a stopped cluster does nothing."""
        self.ready = False
        if "slurmctld" not in self.stopped_daemons():
            self._cancel_jobs(grace)
        for name in reversed(DAEMONS):
            process, pid = self.processes.pop(name, None), self.pids.pop(name, None)
            if process is not None:
                # This process's child: wait() also reaps it.
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(timeout=grace)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(timeout=30)
            elif pid is not None and _is_daemon_of(pid, self.root):
                _end_process(pid, self.root, grace)
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


# -- the machine's private Slurm, across processes ------------------------------------------------------


def start_local_slurm(state_dir: str | os.PathLike | None = None, *, timeout: float = 60,
                      **options) -> tuple[LocalSlurmCluster, bool]:
    """The private Slurm of ``state_dir`` (default: :func:`state_dir_or_default`) and whether this call started it.

    One already running there is returned as it is (``options`` apply only to a new one); what is left
    of one that died (a daemon killed, a reboot) is cleared first. The daemons outlive this process:
    :func:`stop_local_slurm` ends them. ``options`` are :class:`LocalSlurmCluster`'s.
    """
    root = state_dir_or_default(state_dir)
    existing = LocalSlurmCluster.attach(root)
    if existing is not None:
        if existing.is_running:
            return existing, False
        existing.stop()
    return LocalSlurmCluster(state_dir=root, **options).start(timeout), True


def running_local_slurm(state_dir: str | os.PathLike | None = None) -> LocalSlurmCluster | None:
    """The private Slurm running in ``state_dir`` (default: :func:`state_dir_or_default`), or ``None``."""
    cluster = LocalSlurmCluster.attach(state_dir_or_default(state_dir))
    return cluster if cluster is not None and cluster.is_running else None


def stop_local_slurm(state_dir: str | os.PathLike | None = None, *, grace: float = 10.0) -> bool:
    """Cancel the jobs of the private Slurm in ``state_dir``, end its daemons and remove the folder.

    ``False`` when the folder holds no local Slurm (nothing is touched then), so stopping twice is harmless.
    """
    cluster = LocalSlurmCluster.attach(state_dir_or_default(state_dir))
    if cluster is None:
        return False
    cluster.stop(grace)
    return True
