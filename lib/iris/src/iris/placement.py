"""Where a job's supervisor runs: where the engine keeps it alive, so closing the submitting machine
never orphans a job.

* ``slurm``: the supervisor is a Slurm batch job of its own (one CPU, a little memory, the job's
  partition, the job's tag, and a time limit when the job has one: every attempt to the job's
  limit, each after a wait for its allocation; :func:`supervisor_time_limit_s`), submitted through
  fray like the replicas it then submits. Slurm keeps it running
  whatever happens to the machine that submitted it; the job database (``IRIS_HOME``) and the job
  folders must be on storage the nodes share, as the Slurm docs of this project ask anyway. The
  record keeps a locator of that batch job (``JobRecord.supervisor_job``), so any process that
  reads the database can tell whether the supervisor still runs, by asking Slurm.
* ``ray`` on an existing cluster this machine is a node of (``ray_address`` set, not ``ray://``):
  the supervisor is a detached Ray job (``lifetime="detached"``) on the submitting machine's node,
  so it outlives the runner and every other process started from the submitting shell; it writes
  the job database of that node, and it ends with that node. Its locator names the actor, which
  any driver of the cluster looks up.
* ``local``, ``ray`` with a private cluster the supervisor starts itself, and ``ray://`` client
  sessions (no node of their own to pin the database to): a process of the submitting machine in
  a session of its own (it outlives the command and the terminal that started it, not the machine).

``IRIS_SUPERVISOR=here`` keeps every supervisor on the submitting machine (a Slurm site that
forbids submitting from compute nodes). A stop request reaches a supervisor through the database
(it polls ``stop_requested``); one on this machine also gets SIGTERM, for promptness.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from fray.cluster import JobRequest, JobStatus, ResourceConfig
from rigging.lease import process_alive
from rigging.log import get_logger

from iris.errors import IrisError
from iris.spec import JobSpec
from iris.store import JobRecord, JobStore

logger = get_logger(__name__)

SUPERVISOR_VARIABLE = "IRIS_SUPERVISOR"
# What a supervisor asks of the engine: it only waits on replicas and writes the job database.
SUPERVISOR_RESOURCES = ResourceConfig.with_cpu(cpu=1, ram="512m")
# How long an answer about a supervisor on the engine is trusted: asking Slurm costs a command.
_LIVENESS_TTL_S = 2.0
# What one attempt may take beyond the job's own time limit: the wait for its replicas' allocations
# (fray's SlurmClient gives up after 30 minutes), starting them and stopping them.
ATTEMPT_ALLOWANCE_S = 1800.0 + 300.0
_liveness: dict[str, tuple[float, bool]] = {}


class SupervisorPlacementError(IrisError, ValueError):
    """``IRIS_SUPERVISOR`` names no known placement."""


def supervised_on_engine(spec: JobSpec) -> bool:
    """Whether the job's supervisor runs on its engine (see the module docstring)."""
    setting = os.environ.get(SUPERVISOR_VARIABLE, "engine").strip().lower() or "engine"
    if setting not in ("engine", "here"):
        raise SupervisorPlacementError(f"{SUPERVISOR_VARIABLE}={setting!r}: use 'engine' (the default) or 'here'.")
    # A ray:// client session has no node of its own to pin the supervisor (and the database) to.
    on_ray_cluster = spec.backend == "ray" and spec.ray_address is not None and not spec.ray_address.startswith("ray://")
    return setting == "engine" and (spec.backend == "slurm" or on_ray_cluster)


def supervisor_time_limit_s(spec: JobSpec) -> float | None:
    """The time limit of a supervisor that runs on the engine: each attempt the job's budgets allow,
    to the job's own time limit and :data:`ATTEMPT_ALLOWANCE_S`; none for a job without a time limit."""
    if spec.time_limit_s is None:
        return None
    attempts = 1 + spec.max_retries_failure + spec.max_retries_preemption
    return attempts * (spec.time_limit_s + ATTEMPT_ALLOWANCE_S)


def start_supervisor(spec: JobSpec, store: JobStore, job_id: str, secrets: Mapping[str, str]) -> None:
    """Start job ``job_id``'s supervisor where :func:`supervised_on_engine` says, and record where."""
    log = store.log_folder(job_id) / "supervisor.log"
    if supervised_on_engine(spec):
        # The command appends to the same log a local supervisor writes, in the job database's folder.
        command = ["/bin/sh", "-c", 'exec "$0" -m iris.supervisor "$1" "$2" >>"$3" 2>&1',
                   sys.executable, str(store.home), job_id, str(log)]
        request = JobRequest(name=f"iris-supervisor-{job_id}", entrypoint=command, resources=SUPERVISOR_RESOURCES,
                             env=dict(secrets), cwd=spec.cwd, tag=spec.tag, time_limit_s=supervisor_time_limit_s(spec))
        if spec.backend == "slurm":
            from fray.cluster.slurm_client import SlurmClient

            handle = SlurmClient(spec.slurm_partition).submit(request)
            where = f"on Slurm as batch job {handle.job_id}"
        else:
            from fray.cluster.ray_client import RayClient

            client = RayClient(spec.ray_address, check_resources=False)
            # The supervisor reaches the cluster as this driver did: the same GCS address and the
            # Ray settings of this environment (an auth token), not whatever its worker inherits.
            reach = {name: value for name, value in os.environ.items() if name.startswith("RAY_")}
            reach["RAY_ADDRESS"] = client.gcs_address()
            request = dataclasses.replace(request, env={**request.env, **reach})
            handle = client.submit(request, detached=True)
            where = f"on Ray as detached job {handle.job_id}"
        store.set_supervisor_job(job_id, json.dumps({**handle.locator(), "address": spec.ray_address}))
        logger.info("Job %s: its supervisor runs %s", job_id, where)
        return
    with open(log, "ab") as supervisor_log:
        process = subprocess.Popen(
            [sys.executable, "-m", "iris.supervisor", str(store.home), job_id],
            stdin=subprocess.DEVNULL,
            stdout=supervisor_log,
            stderr=subprocess.STDOUT,
            cwd=spec.cwd if spec.cwd and os.path.isdir(spec.cwd) else None,
            env={**os.environ, **secrets},
            # A session of its own: the job outlives this command and the terminal it ran in.
            start_new_session=True,
        )
    store.set_supervisor(job_id, process.pid)


def supervisor_alive(record: JobRecord) -> bool:
    """Whether the job's supervisor may still run (and so may still write the job's final state)."""
    if record.supervisor_job:
        return _engine_supervisor_alive(record.job_id, record.supervisor_job)
    return _process_alive(record.supervisor_pid)


def signal_supervisor(record: JobRecord) -> None:
    """SIGTERM to a supervisor that is a process of this machine (one on the engine polls the database)."""
    if record.supervisor_job or not _process_alive(record.supervisor_pid):
        return
    try:
        os.kill(record.supervisor_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _engine_supervisor_alive(job_id: str, locator_text: str) -> bool:
    checked = _liveness.get(job_id)
    if checked is not None and time.monotonic() - checked[0] < _LIVENESS_TTL_S:
        return checked[1]
    try:
        locator = json.loads(locator_text)
        if locator.get("backend") == "slurm":
            from fray.cluster.slurm_client import SlurmClient

            status = SlurmClient(check_resources=False).attach(locator).status()
        elif locator.get("backend") == "ray":
            from fray.cluster.ray_client import RayClient

            status = RayClient(locator.get("address"), check_resources=False).attach(locator).status()
        else:
            raise ValueError(f"unknown backend {locator.get('backend')!r}")
        alive = status in (JobStatus.PENDING, JobStatus.RUNNING)
    except Exception as exc:  # noqa: BLE001 - an engine that cannot be asked right now is not a dead supervisor
        logger.warning("Job %s: could not ask where its supervisor runs (%s); taking it as alive", job_id, exc)
        alive = True
    _liveness[job_id] = (time.monotonic(), alive)
    return alive


def _process_alive(pid: int | None) -> bool:
    return pid is not None and process_alive(pid)
