"""``SlurmClient``: jobs, remote calls and map tasks as Slurm batch jobs, one ``sbatch`` each.

Built on Slurm's own commands (``sbatch``, ``scontrol show job``, ``scancel``, ``sinfo``), not on
submitit: submitit reads job states from ``sacct``, which a Slurm without ``slurmdbd`` does not
have; on our test cluster submitit 1.5.4's ``job.state`` stayed ``UNKNOWN`` while the job ran and
after it completed (only its result file said it was done), so a timeout, a cancel or a lost node
look alike. Here the controller's live view plus the worker's own record in the job folder is enough.

Each job has a folder under ``job_root`` (default ``~/.cache/fray/slurm``, or ``FRAY_SLURM_DIR``),
which must be on storage the submitting machine and the nodes share; Python is this process's
(``python=`` for another path on the nodes). The batch script runs :mod:`fray.cluster.slurm_worker`,
which reports a free ``HOST:PORT`` of its node, waits for ``start(env)`` when submitted with
``start=False``, runs the command with its output in the folder's ``output.log`` and records its
exit code (75 stays 75). So iris can hold every replica's allocation before it starts any.

How a request becomes ``sbatch`` options (shown in the folder's ``job.sh``):

* ``cpu`` -> ``--cpus-per-task`` (rounded up); ``ram`` -> ``--mem`` (MiB, rounded up);
* a GPU -> ``--gres=gpu:TYPE:N``, the type spelled as the cluster spells it (``"auto"``: ``gpu:N``);
* TPUs and ``custom`` resources are refused: Slurm has no TPUs, and its own resources go through
  ``sbatch_options`` (``--constraint``, ``--gres``);
* ``JobRequest.time_limit_s`` -> ``--time`` (whole minutes, rounded up), and
  ``--signal=B:TERM@warn_before_s`` so the command hears SIGTERM that long before any time limit;
* ``JobRequest.tag`` -> ``--comment``, which ``squeue`` shows: :meth:`SlurmClient.tagged_jobs`
  finds the jobs of a tag from any machine (iris finds a fenced-off execution's jobs so);
* always ``--no-requeue``: iris owns retries and counts preemptions, so Slurm must not rerun a job
  behind its back; plus ``partition``, ``account``, ``qos`` and ``sbatch_options`` as given.

A job submitted with ``start=False`` waits on its node for ``start(env)`` at most
``allocation_timeout_s`` and a minute more (the submitter gives up on the allocation of the job's
peers by then, and releases them all): a job whose submitter died never holds its allocation for
longer.

Signals: ``scancel --batch --signal=TERM JOB`` is the command that delivers SIGTERM to a job's
command (the batch script forwards it to the command's process group; plain ``scancel --signal``
signals job steps only, and these jobs have none). ``scancel JOB``, a preemption and a time
limit reach it too. Actors do not exist on Slurm; see :meth:`SlurmClient.create_actor`.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import re
import shlex
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from rigging.log import get_logger
from rigging.secrets import split_secrets

from fray.cluster.client import ActorHandle, JobRequest, UnschedulableError, describe_request
from fray.cluster.resources import GpuDevice, ResourceConfig, TpuDevice
from fray.cluster.slurm_commands import (
    DEFAULT_COMMAND_TIMEOUT_S,
    SlurmCommandError,
    JobStateBoard,
    SlurmPartitions,
    partitions,
    run_slurm,
)
from fray.cluster.slurm_job import SlurmJob, SlurmJobEnded, SlurmTimings
from fray.cluster.slurm_worker import write_atomically
from fray.cluster.task_map import call_shipped, run_tasks, task_name
from fray.cluster.worker_pool import ShippedFile
from fray.errors import FrayError

logger = get_logger(__name__)

JOB_ROOT_ENV = "FRAY_SLURM_DIR"
WORKER_SCRIPT = Path(__file__).with_name("slurm_worker.py")
_MIB = 1 << 20
PARTITIONS_TTL_S = 30.0
# How much longer than the allocation timeout a job submitted with start=False waits for its start.
START_MARGIN_S = 60.0


class SlurmActorsUnsupported(FrayError, NotImplementedError):
    """Slurm has no actors."""


class SlurmJobRootError(FrayError, ValueError):
    """A job root that the nodes cannot open as a folder."""


def default_job_root() -> str:
    return os.environ.get(JOB_ROOT_ENV) or str(Path.home() / ".cache" / "fray" / "slurm")


@dataclass(frozen=True)
class SlurmJobRecordOfTag:
    """A job :meth:`SlurmClient.tagged_jobs` found: Slurm's id, its state and its tag."""

    slurm_id: str
    state: str
    tag: str


def _user() -> str:
    import getpass

    return getpass.getuser()


class SlurmFuture(cf.Future):
    """A remote call's future; ``cancel()`` also cancels its Slurm job."""

    def __init__(self, job: SlurmJob) -> None:
        super().__init__()
        self.job = job

    def cancel(self) -> bool:
        if self.done():
            return False
        threading.Thread(target=self.job.release, name=f"fray-slurm-cancel-{self.job.job_id}", daemon=True).start()
        return super().cancel()


class SlurmClient:
    """Runs work as Slurm batch jobs; see the module docstring.

    ``partition``, ``account``, ``qos``: the usual ``sbatch`` options (``None``: the cluster's
    defaults). ``job_root``: the folder of job folders, shared with the nodes. ``sbatch_options``:
    more options as written, e.g. ``("--constraint=ib",)``. ``command_timeout_s``: the most any one
    Slurm command may take. ``allocation_timeout_s``: how long ``free_address`` waits for a queued
    job. ``warn_before_s``: SIGTERM this long before a time limit. ``task_retries``: map's default
    ``max_retries`` (nodes come and go). ``check_resources=False`` skips the ``sinfo`` check (a
    cluster whose partitions ``sinfo`` hides).
    """

    def __init__(self, partition: str | None = None, *, account: str | None = None, qos: str | None = None,
                 job_root: str | None = None, sbatch_options: Sequence[str] = (), python: str | None = None,
                 command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S, poll_interval_s: float = 1.0,
                 allocation_timeout_s: float = 1800.0, terminate_grace_s: float = 5.0, warn_before_s: int = 120,
                 task_retries: int = 2, check_resources: bool = True) -> None:
        self.partition = partition
        self.account = account
        self.qos = qos
        self.job_root = os.path.expanduser(job_root or default_job_root())
        if "://" in self.job_root:
            raise SlurmJobRootError(
                f"job_root {self.job_root!r} is a URL, but Slurm writes a job's output to a path itself: give a "
                f"folder the submitting machine and the nodes both mount (job_root=... or {JOB_ROOT_ENV}).")
        self.sbatch_options = tuple(sbatch_options)
        self.python = python or sys.executable
        self.timings = SlurmTimings(command_timeout_s=command_timeout_s, poll_interval_s=poll_interval_s,
                                    allocation_timeout_s=allocation_timeout_s, terminate_grace_s=terminate_grace_s)
        self.warn_before_s = warn_before_s
        self.task_retries = task_retries
        self.check_resources = check_resources
        self._known: tuple[float, SlurmPartitions] | None = None
        self._lock = threading.Lock()
        self._board = JobStateBoard()  # one squeue call per poll for all of this client's jobs

    def __repr__(self) -> str:
        return f"SlurmClient(partition={self.partition!r})"

    # -- resources --------------------------------------------------------------------------------------

    def _partitions(self) -> SlurmPartitions:
        # Asked once per PARTITIONS_TTL_S, not per job: a map call submits a job per item.
        with self._lock:
            if self._known is None or time.monotonic() - self._known[0] > PARTITIONS_TTL_S:
                self._known = (time.monotonic(), partitions(timeout=self.timings.command_timeout_s))
            return self._known[1]

    def check_fits(self, resources: ResourceConfig | None, *, what: str = "this request") -> None:
        resources = resources or ResourceConfig()
        _refuse_unsupported(resources, what)
        if not self.check_resources:
            return
        cluster = self._partitions()
        why = _why_none_fits(resources, cluster, self.partition)
        if why is not None:
            raise UnschedulableError(f"{what} asks for {describe_request(resources)} on Slurm, but {why}.")

    def partition_time_limit_s(self) -> float | None:
        """The time limit Slurm gives a job of this client's partition that asks for none (its
        MaxTime); None when the partition has none, where such a job could run for ever."""
        return self._partitions().time_limit_s(self.partition)

    def sbatch_header(self, request: JobRequest, folder: str, gpu_type: str | None) -> list[str]:
        """The ``#SBATCH`` options of ``request`` (see the module docstring)."""
        resources = request.resources
        options = [
            f"--job-name={request.name}",
            f"--output={folder}/output.log",
            "--open-mode=append",
            f"--chdir={folder}",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={math.ceil(resources.cpu)}",
            f"--mem={math.ceil(resources.ram_bytes / _MIB)}M",
            "--no-requeue",
        ]
        if isinstance(resources.device, GpuDevice):
            kind = gpu_type if gpu_type is not None else resources.device.variant
            options.append(f"--gres=gpu:{resources.device.count}" if kind in ("auto", "")
                           else f"--gres=gpu:{kind}:{resources.device.count}")
        if request.time_limit_s is not None:
            options.append(f"--time={math.ceil(request.time_limit_s / 60)}")
        if request.tag is not None:
            options.append(f"--comment={request.tag}")
        # Slurm sends the warning up to a minute early; a job shorter than that would hear it at once.
        if request.time_limit_s is None or request.time_limit_s > 2 * self.warn_before_s:
            options.append(f"--signal=B:TERM@{self.warn_before_s}")
        for name in ("partition", "account", "qos"):
            if getattr(self, name):
                options.append(f"--{name}={getattr(self, name)}")
        options.extend(self.sbatch_options)
        return options

    def _gpu_type(self, resources: ResourceConfig) -> str | None:
        """The cluster's spelling of the requested GPU type (Slurm compares them case-sensitively)."""
        if not isinstance(resources.device, GpuDevice) or not self.check_resources:
            return None
        wanted = resources.device.variant.lower()
        for node in self._partitions().nodes:
            for kind in node.gpus:
                if kind.lower() == wanted:
                    return kind
        return None

    # -- jobs -------------------------------------------------------------------------------------------

    def submit(self, request: JobRequest, *, start: bool = True, result_file: bool = False) -> SlurmJob:
        """``request`` as one Slurm batch job; with ``start=False`` it holds its allocation until ``job.start(env)``."""
        self.check_fits(request.resources, what=f"job {request.name!r}")
        folder = os.path.join(self.job_root, f"{_safe(request.name)}-{uuid.uuid4().hex[:8]}")
        os.makedirs(folder)
        try:
            command = self._command(request, folder, result_file)
            public, secret = split_secrets({str(k): str(v) for k, v in request.env.items()})
            if secret:
                write_atomically(os.path.join(folder, "request-secrets.json"), json.dumps(secret), private=True)
            with open(os.path.join(folder, "request.json"), "w") as handle:
                json.dump({"name": request.name, "command": command, "start": start, "cwd": request.cwd,
                           "env": public, "start_timeout_s": self.timings.allocation_timeout_s + START_MARGIN_S},
                          handle, indent=1)
            script = os.path.join(folder, "job.sh")
            header = self.sbatch_header(request, folder, self._gpu_type(request.resources))
            with open(script, "w") as handle:
                handle.write("#!/bin/sh\n" + "".join(f"#SBATCH {option}\n" for option in header))
                handle.write(f"exec {shlex.quote(self.python)} -I {shlex.quote(str(WORKER_SCRIPT))} {shlex.quote(folder)}\n")
            output = run_slurm(["sbatch", "--parsable", script], timeout=self.timings.command_timeout_s)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        slurm_id = output.strip().split(";")[0]
        logger.info("Slurm job %s: %s (%s)", slurm_id, request.name, folder)
        return SlurmJob(slurm_id, folder, request.name, started=start, timings=self.timings, board=self._board)

    def tagged_jobs(self, tag_prefix: str) -> list[SlurmJobRecordOfTag]:
        """Every job of this user that Slurm still knows, not yet ended, whose tag (``JobRequest.tag``)
        starts with ``tag_prefix``."""
        output = run_slurm(["squeue", "-h", "-u", _user(), "-o", "%i|%T|%k"], timeout=self.timings.command_timeout_s)
        found = []
        for line in output.splitlines():
            slurm_id, _, rest = line.strip().partition("|")
            state, _, tag = rest.partition("|")
            if tag.startswith(tag_prefix):
                found.append(SlurmJobRecordOfTag(slurm_id, state, tag))
        return found

    def cancel(self, slurm_ids: Iterable[str], *, kill: bool = False) -> None:
        """``scancel`` the jobs: Slurm's SIGTERM, then SIGKILL after its ``KillWait`` (at once with
        ``kill``); jobs that ended already are no error."""
        ids = sorted(set(slurm_ids))
        if ids:
            try:
                run_slurm(["scancel", *(["--full", "--signal=KILL"] if kill else []), *ids],
                          timeout=self.timings.command_timeout_s)
            except SlurmCommandError as exc:  # one of them ended meanwhile
                logger.debug("scancel %s: %s", " ".join(ids), exc)

    def attach(self, locator: dict[str, str]) -> SlurmJob:
        """The handle of a job another process submitted, from its :meth:`SlurmJob.locator`."""
        return SlurmJob(str(locator["slurm_id"]), str(locator["folder"]), str(locator["name"]), started=True,
                        timings=self.timings, board=self._board)

    def _command(self, request: JobRequest, folder: str, result_file: bool) -> list[str]:
        if request.is_command:
            return list(request.entrypoint)
        payload = os.path.join(folder, "payload.pkl")
        with open(payload, "wb") as handle:
            cloudpickle.dump((request.entrypoint, tuple(request.args), dict(request.kwargs)), handle)
        command = [self.python, "-m", "fray.cluster.job_worker", payload]
        return [*command, os.path.join(folder, "result.pkl")] if result_file else command

    # -- remote functions -------------------------------------------------------------------------------

    def remote(self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> SlurmFuture:
        """``fn(*args, **kwargs)`` as a Slurm job; its return value (or exception) comes back through its folder."""
        return self._call(fn, args, kwargs, resources, task_name(fn))

    def _call(self, fn: Callable[..., Any], args: tuple, kwargs: dict, resources: ResourceConfig | None,
              name: str) -> SlurmFuture:
        request = JobRequest(name, fn, args=args, kwargs=kwargs, resources=resources or ResourceConfig(),
                             cwd=os.getcwd())
        future = SlurmFuture(self.submit(request, result_file=True))
        threading.Thread(target=_collect, args=(future,), name=f"fray-slurm-{future.job.job_id}", daemon=True).start()
        return future

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *, resources: ResourceConfig | None = None,
            max_retries: int | None = None, on_result: Callable[[int, Any], None] | None = None) -> list:
        """Each item as a Slurm job; ``fn`` is written once per call to a file all of them read."""
        items = list(items)
        if not items:
            return []
        name = task_name(fn)
        self.check_fits(resources, what=name)
        call_folder = os.path.join(self.job_root, f"map-{_safe(name)}-{uuid.uuid4().hex[:8]}")
        os.makedirs(call_folder)
        try:
            shipped = ShippedFile(os.path.join(call_folder, "function.pkl"))
            with open(shipped.path, "wb") as handle:
                cloudpickle.dump(fn, handle)
            key = uuid.uuid4().hex
            return run_tasks(lambda index: self._call(call_shipped, (key, shipped, items[index]), {}, resources, name),
                             len(items), name=name, on_result=on_result,
                             max_retries=self.task_retries if max_retries is None else max_retries)
        finally:
            shutil.rmtree(call_folder, ignore_errors=True)

    def create_actor(self, cls: type, *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> ActorHandle:
        raise SlurmActorsUnsupported(
            f"Slurm has no actors, so {getattr(cls, '__name__', 'this class')} cannot run as one: run a server as a "
            "job (client.submit(..., start=False), job.free_address(), job.start(env)) and talk to it over the "
            "network, or use RayClient / LocalClient for actors.")

    def shutdown(self) -> None:
        """Nothing to close: jobs still running are the caller's to stop (``release()``)."""


def _collect(future: SlurmFuture) -> None:
    """Wait for a remote call's job and settle its future from the pickled result."""
    job = future.job
    try:
        status = job.wait()
        path = os.path.join(job.folder, "result.pkl")
        if os.path.exists(path):
            with open(path, "rb") as handle:
                ok, value = cloudpickle.load(handle)
        else:
            tail = job.logs()[-2000:]
            ok, value = False, SlurmJobEnded(
                f"remote call {job.name!r} (Slurm job {job.job_id}) ended {status.value} with exit code "
                f"{job.exit_code()} and no result; its output ends with:\n{tail}")
    except BaseException as error:  # noqa: BLE001 - a result that cannot be read back
        ok, value = False, error
    if not future.cancelled():
        try:
            future.set_result(value) if ok else future.set_exception(value)
        except cf.InvalidStateError:
            pass  # cancelled meanwhile
    job.release()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:60] or "job"


def _refuse_unsupported(resources: ResourceConfig, what: str) -> None:
    if isinstance(resources.device, TpuDevice):
        raise UnschedulableError(f"{what} asks for TPU {resources.device.type}, but Slurm clusters have no TPUs: "
                                 "run it on a Ray cluster of TPU VMs (MARIN_CLUSTER=ray) or ask for GPUs or CPUs.")
    if resources.custom:
        names = ", ".join(name for name, _ in resources.custom)
        raise UnschedulableError(f"{what} asks for custom resources ({names}), which Slurm does not know: "
                                 "give SlurmClient(sbatch_options=['--constraint=...']) or a --gres option instead.")


def _why_none_fits(resources: ResourceConfig, cluster: SlurmPartitions, partition: str | None) -> str | None:
    """What the partition lacks for ``resources``, in words; ``None`` when one of its nodes can hold it."""
    if not cluster.nodes:
        return "sinfo lists no partitions"
    chosen = partition or cluster.default
    if partition is not None and partition not in cluster.names:
        return f"the cluster has no partition {partition!r} (its partitions: {', '.join(cluster.names)})"
    nodes = cluster.of(chosen) if chosen else list(cluster.nodes)
    where = f"partition {chosen!r}" if chosen else "the cluster"
    cpus, memory_mib = math.ceil(resources.cpu), math.ceil(resources.ram_bytes / _MIB)
    device = resources.device
    if isinstance(device, GpuDevice):
        def has_gpus(node) -> bool:
            if device.variant == "auto":
                return sum(node.gpus.values()) >= device.count
            return sum(n for kind, n in node.gpus.items() if kind.lower() == device.variant.lower()) >= device.count

        if not any(has_gpus(node) for node in nodes):
            elsewhere = sorted({node.partition for node in cluster.nodes if has_gpus(node)})
            present = sorted({f"{kind or 'untyped'} x {count} in {node.partition!r}" for node in cluster.nodes
                              for kind, count in node.gpus.items()})
            return (f"no node of {where} has {device.count} x {device.variant} GPU"
                    + (f" (partitions that do: {', '.join(elsewhere)})" if elsewhere else
                       f"; GPUs of the cluster: {', '.join(present) or 'none'}"))
        nodes = [node for node in nodes if has_gpus(node)]
    if not any(node.cpus >= cpus for node in nodes):
        return f"no node of {where} has {cpus} CPUs (the most: {max(node.cpus for node in nodes)})"
    if not any(node.memory_mib >= memory_mib for node in nodes):
        return f"no node of {where} has {memory_mib} MiB of memory (the most: {max(node.memory_mib for node in nodes)} MiB)"
    if not any(node.cpus >= cpus and node.memory_mib >= memory_mib for node in nodes):
        return f"no single node of {where} has both {cpus} CPUs and {memory_mib} MiB"
    return None
