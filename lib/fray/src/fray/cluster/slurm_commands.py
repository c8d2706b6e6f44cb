"""Slurm's own commands (``sbatch``, ``scontrol``, ``scancel``, ``sinfo``), each with a time limit.

Every call has a timeout, so a controller that is down or unreachable is one
:class:`SlurmUnavailableError` line within seconds, never a hang; a machine with no controller
configured at all (no ``SLURM_CONF``, no ``slurm.conf``) is one :class:`SlurmNotConfiguredError`
line; both name the command that starts a private Slurm on this machine. Any other refusal is a
:class:`SlurmCommandError` carrying Slurm's own first line. Parsers turn the commands' output
into plain values: a job's record from ``scontrol show job -o`` and the nodes of each partition
from ``sinfo``. Nothing here reads accounting (``sacct``): a Slurm without ``slurmdbd`` has none.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

from fray.cluster.slurm_local import running_local_slurm
from fray.errors import FrayError

DEFAULT_COMMAND_TIMEOUT_S = 20.0
# Where Debian's Slurm commands look when SLURM_CONF is unset.
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
START_PRIVATE = "start a private Slurm on this machine with `marin slurm start`"
# What Slurm's commands print when they cannot reach slurmctld.
_UNREACHABLE = ("unable to contact slurm controller", "connection refused", "zero bytes were transmitted",
                "communication connection failure", "socket timed out", "unable to establish a connection")
# What they print when they find no configuration: no slurm.conf, and no DNS SRV record of a
# controller to fetch one from (Slurm's "configless" mode).
_NOT_CONFIGURED = ("could not establish a configuration source", "resolve_ctls_from_dns_srv",
                   "fetch_config: dns srv lookup failed")


class SlurmError(FrayError, RuntimeError):
    """A Slurm command failed."""


class SlurmUnavailableError(SlurmError):
    """Slurm's controller cannot be reached (or its commands are not installed)."""


class SlurmNotConfiguredError(SlurmUnavailableError):
    """No Slurm controller is configured here: ``SLURM_CONF`` unset (and no ``slurm.conf``) or naming no file."""


class SlurmCommandError(SlurmError):
    """Slurm refused a command (an invalid option, an unknown account, a job that does not exist)."""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def not_configured(detail: str) -> SlurmNotConfiguredError:
    """The one-line error for a machine without a Slurm configuration; ``detail`` says what is missing."""
    running = running_local_slurm()
    if running is not None:
        # The usual slip: the private Slurm runs, but this shell never took its SLURM_CONF.
        remedy = f"a private Slurm is running on this machine: `{running.export_line}` to use it"
    else:
        remedy = f"set SLURM_CONF to your cluster's slurm.conf, or {START_PRIVATE}"
    return SlurmNotConfiguredError(f"No Slurm controller is configured here: {detail}; {remedy}.")


def _configuration_problem() -> str | None:
    """What is missing before any command runs: a SLURM_CONF that names no file (Slurm would retry it for a minute)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        return f"SLURM_CONF={conf} names no file"
    return None


def run_slurm(args: list[str], *, timeout: float = DEFAULT_COMMAND_TIMEOUT_S, input: str | None = None) -> str:
    """The stdout of Slurm command ``args``; raises one line saying what went wrong instead."""
    program = args[0]
    problem = _configuration_problem()
    if problem is not None:
        raise not_configured(problem)
    if shutil.which(program) is None:
        raise SlurmUnavailableError(f"`{program}` is not installed here: a Slurm client needs Slurm's commands "
                                    "(Debian: apt-get install slurm-client) on the submitting machine.")
    where = f" (SLURM_CONF={os.environ['SLURM_CONF']})" if os.environ.get("SLURM_CONF") else ""
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailableError(f"`{' '.join(args[:3])} ...` did not answer within {timeout:g} s: is the Slurm "
                                    f"controller up{where}? (`scontrol ping` checks; or {START_PRIVATE})") from None
    if result.returncode != 0:
        if any(marker in (result.stderr + result.stdout).lower() for marker in _NOT_CONFIGURED):
            raise not_configured(f"SLURM_CONF is unset and {DEFAULT_SLURM_CONF} does not exist (`{program}`: "
                                 "could not establish a configuration source)")
        message = _first_line(result.stderr) or _first_line(result.stdout) or f"exit status {result.returncode}"
        if any(marker in message.lower() for marker in _UNREACHABLE):
            raise SlurmUnavailableError(f"the Slurm controller cannot be reached{where}: `{program}` says {message!r}; "
                                        f"is it up (`scontrol ping`)? Or {START_PRIVATE}")
        raise SlurmCommandError(f"`{' '.join(args[:2])}` failed: {message}")
    return result.stdout


# -- jobs ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmJobRecord:
    """What ``scontrol show job`` says about one job."""

    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, ...
    reason: str
    exit_code: int | None  # the batch script's status: negative for a signal, None when not ended
    node: str


_FIELD = re.compile(r"(\w[\w/:]*)=(\S*)")


def parse_job_record(line: str) -> SlurmJobRecord:
    """A job from one line of ``scontrol show job -o``."""
    fields = dict(_FIELD.findall(line))
    state = fields.get("JobState", "UNKNOWN").split("+")[0]
    exit_code = None
    if "ExitCode" in fields and state not in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED", "REQUEUED"):
        status, _, signum = fields["ExitCode"].partition(":")
        exit_code = -int(signum) if signum and signum != "0" else int(status)
    return SlurmJobRecord(state=state, reason=fields.get("Reason", ""), exit_code=exit_code,
                          node=fields.get("BatchHost", fields.get("NodeList", "")))


def job_record(slurm_id: str, *, timeout: float = DEFAULT_COMMAND_TIMEOUT_S) -> SlurmJobRecord | None:
    """Slurm's record of the job, or ``None`` when the controller no longer knows it (``MinJobAge`` passed)."""
    try:
        output = run_slurm(["scontrol", "show", "job", "-o", slurm_id], timeout=timeout)
    except SlurmCommandError as exc:
        if "invalid job id" in str(exc).lower():
            return None
        raise
    lines = [line for line in output.splitlines() if line.strip()]
    return parse_job_record(lines[0]) if lines else None


class JobStateBoard:
    """The records of every job this process follows, from one ``squeue`` call per refresh.

    A map over a thousand items is a thousand Slurm jobs; asking the controller about each of
    them every second would be a thousand commands a second. Jobs are followed from
    :meth:`follow` until :meth:`forget`; a record is at most ``max_age_s`` old when read. A job
    ``squeue -t all`` no longer lists (``MinJobAge`` passed) reads as ``None``. ``squeue`` has no
    exit codes: for a job that ended without its worker's record, :func:`job_record` asks once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._followed: set[str] = set()
        self._records: dict[str, SlurmJobRecord] = {}
        self._asked: set[str] = set()  # the ids the last refresh asked about
        self._refreshed_at = float("-inf")

    def follow(self, slurm_id: str) -> None:
        with self._lock:
            self._followed.add(slurm_id)

    def forget(self, slurm_id: str) -> None:
        with self._lock:
            self._followed.discard(slurm_id)
            self._records.pop(slurm_id, None)

    def record(self, slurm_id: str, *, max_age_s: float, timeout: float) -> SlurmJobRecord | None:
        with self._lock:
            self._followed.add(slurm_id)
            # A job the last refresh did not ask about (just submitted) is missing from it for that
            # reason alone, not because the controller forgot it: ask again.
            if slurm_id not in self._asked or time.monotonic() - self._refreshed_at >= max_age_s:
                self._refresh(timeout)
            return self._records.get(slurm_id)

    def _refresh(self, timeout: float) -> None:
        asked = set(self._followed)
        ids = ",".join(sorted(asked))
        try:
            output = run_slurm(["squeue", "-h", "-t", "all", "-j", ids, "-o", "%i|%T|%r|%B"], timeout=timeout)
        except SlurmCommandError as exc:
            if "invalid job id" not in str(exc).lower():
                raise
            # One forgotten id fails the whole query: ask about each, so the others keep their state.
            output = ""
            if len(asked) > 1:
                for one in sorted(asked):
                    try:
                        output += run_slurm(["squeue", "-h", "-t", "all", "-j", one, "-o", "%i|%T|%r|%B"], timeout=timeout)
                        output += "\n"
                    except SlurmCommandError as single:
                        if "invalid job id" not in str(single).lower():
                            raise
        self._records = {}
        for line in output.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 4:
                self._records[fields[0]] = SlurmJobRecord(state=fields[1].split("+")[0], reason=fields[2],
                                                          exit_code=None, node=fields[3])
        self._asked = asked
        self._refreshed_at = time.monotonic()


# -- partitions and nodes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmNode:
    """One node of one partition, as ``sinfo`` describes it."""

    name: str
    partition: str
    cpus: int
    memory_mib: int
    gpus: dict[str, int]  # GPU type (as Slurm spells it, "" when untyped) -> count
    time_limit_s: float | None = None  # the partition's MaxTime; None: unlimited


@dataclass(frozen=True)
class SlurmPartitions:
    nodes: tuple[SlurmNode, ...]
    default: str | None  # the partition a job without --partition goes to

    @property
    def names(self) -> list[str]:
        return sorted({node.partition for node in self.nodes})

    def of(self, partition: str) -> list[SlurmNode]:
        return [node for node in self.nodes if node.partition == partition]

    def time_limit_s(self, partition: str | None) -> float | None:
        """The longest a job may run in ``partition`` (None: its default), which Slurm gives a job
        that asks for no time; None when the partition has no limit (or is unknown)."""
        nodes = self.of(partition or self.default or "")
        return nodes[0].time_limit_s if nodes else None


_SINFO_FORMAT = "%N|%P|%c|%m|%G|%l"


def parse_time_limit(text: str) -> float | None:
    """Seconds of one of Slurm's time limits, None for ``infinite``/``UNLIMITED`` (or what cannot be
    read): ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    text = text.strip()
    days, dash, clock = text.partition("-") if "-" in text else ("0", "", text)
    parts = clock.split(":")
    if not days.isdigit() or not all(part.isdigit() for part in parts) or len(parts) > 3:
        return None
    numbers = [int(part) for part in parts]
    if dash:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    else:  # MM, MM:SS or HH:MM:SS
        hours, minutes, seconds = ([0] * (3 - len(numbers)) + numbers) if len(numbers) == 3 else (0, *(numbers + [0])[:2])
    return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_gres(gres: str) -> dict[str, int]:
    """GPUs in a GRES field such as ``gpu:a100:4(S:0-1),gpu:h100:2`` or ``gpu:8``: type -> count."""
    gpus: dict[str, int] = {}
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        kind, count = (parts[1], parts[2]) if len(parts) >= 3 else ("", parts[1])
        if count.isdigit():
            gpus[kind] = gpus.get(kind, 0) + int(count)
    return gpus


def parse_sinfo(output: str) -> SlurmPartitions:
    nodes, default = [], None
    for line in output.splitlines():
        fields = line.strip().split("|")
        if len(fields) not in (5, 6):
            continue
        name, partition, cpus, memory, gres = fields[:5]
        if partition.endswith("*"):
            partition = partition[:-1]
            default = partition
        nodes.append(SlurmNode(name=name, partition=partition, cpus=int(cpus.rstrip("+") or 0),
                               memory_mib=int(memory.rstrip("+") or 0), gpus=parse_gres(gres),
                               time_limit_s=parse_time_limit(fields[5]) if len(fields) == 6 else None))
    return SlurmPartitions(tuple(nodes), default)


def partitions(*, timeout: float = DEFAULT_COMMAND_TIMEOUT_S) -> SlurmPartitions:
    """Every node of every partition (one row per node and partition)."""
    return parse_sinfo(run_slurm(["sinfo", "-h", "-N", "-o", _SINFO_FORMAT], timeout=timeout))
