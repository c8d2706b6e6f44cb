"""Steps as iris jobs: what a step needs becomes a job on a cluster engine (Slurm, Ray, local).

With the cluster setting ``iris:ENGINE`` (``MARIN_CLUSTER=iris:slurm``, ``cluster: iris:ray`` in
marin.yaml, ``StepRunner(cluster="iris:slurm:gpu")``), each step the runner must run is submitted
to iris, which places its replicas through fray on ENGINE and retries it. The runner keeps doing
everything around the call exactly as for other executors: it holds the step's lease (its
heartbeat goes on while the job runs), writes ``.executor_info``, the status and the artifact.
Cached steps never reach iris.

* The step's ``ResourceConfig`` is the job's: resources per replica, ``replicas`` (a gang, started
  together; multi-host training gets ``IRIS_COORDINATOR_ADDRESS``, ``IRIS_NUM_REPLICAS`` and
  ``IRIS_REPLICA_INDEX``, which :mod:`levanter.distributed` reads), ``max_retries_preemption``,
  ``max_retries_failure`` and ``time_limit_s``.
* Each replica runs :mod:`marin.execution.running.step_job` on the call the runner wrote into the step's
  ``.executions/`` folder, as one fenced execution of the step: it writes into the execution's
  staging folder and stops itself once the execution is fenced off. Replica 0 commits the output
  and records SUCCESS itself, so a job that outlives its runner still records its result.
* iris keeps every attempt's output (all replicas) in the step's ``.attempts/NNN/`` folder, on any
  storage (:mod:`iris.attempt_log`); the job id, its engine and iris database, and the attempt go
  into the step's RUNNING status, so ``marin status`` shows them and any runner can find the job.
* Every engine job of a step's execution carries the execution's tag (:func:`execution_tag`: the
  step and its generation; on Slurm the job's comment), and on Slurm a time limit (the step's own,
  else its partition's, else :data:`DEFAULT_SLURM_TIME_LIMIT_S`). A runner that fences an execution off ends it
  (:meth:`IrisStepExecutor.end_execution`): its iris job is stopped, and every Slurm job tagged with
  the step and a generation up to it is cancelled, so no job outlives its generation, whether its
  supervisor, its runner or both died.
* An interrupted run (Ctrl-C, SIGTERM) or a lost lease stops the job (its replicas get SIGTERM, so
  a training step checkpoints first). Every wait for a job is bounded: one that has not started
  an attempt within ``start_timeout_s`` (a supervisor pending in a full cluster) is stopped and the
  step fails naming it; a running one ends at its time limit. A runner that died leaves its job running: the next runner
  that takes the step's lease over adopts that job, looked up in the iris database the status
  names (whatever ``IRIS_HOME`` the new runner has), instead of starting a second one. A job whose
  supervisor died while its runner lived is ended in the step's record, which fences off its
  replicas: they stop at their next heartbeat.
* Work a step starts itself (a tokenizer's shards) runs inside the step's own allocation
  (``MARIN_CLUSTER=local`` in the job), not as more jobs.
* While the job runs, its progress lines (the trainer's step, loss, tokens/s and ETA) are relayed
  from the attempt's log to the runner's console at a bounded rate
  (:mod:`marin.execution.running.progress_relay`), with one line saying how to follow the whole log.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from fray.cluster import ResourceConfig
from iris import JobRecord, JobState, JobStore, get_job, stop_job, submit_job
from iris.attempt_log import AttemptOutcome, list_attempts, read_log
from iris.retries import replay
from iris.spec import JobSpec, engine_options
from iris.store import IRIS_HOME_VARIABLE
from rigging import filesystem as fsx
from rigging.lease import LeaseLostError
from rigging.log import get_logger
from rigging.names import safe_name_from
from rigging.secrets import SecretNames

from marin.errors import MarinError
from marin.execution.ownership.ending_executions import FENCE_WAIT_S, cancel_tagged_slurm_jobs, execution_tag
from marin.execution.records.executor_files import STATUS_RUNNING, STATUS_SUCCESS, read_status
from marin.execution.running.progress_relay import ProgressRelay
from marin.execution.running.step_context import RunCancelled
from marin.execution.running.step_executor import StepCall
from marin.execution.running.step_job import StepJobCall, call_url, result_url

logger = get_logger("marin.execution.step_runner")

#: Environment variables a step's job gets from the runner (every engine): Marin's own settings,
#: object-store credentials and endpoints, and the offline and compiler settings that change
#: nothing a step computes but everything about whether it can start; so does every variable named
#: a secret explicitly (``rigging.secrets``: ``HUGGING_FACE_HUB_TOKEN``, ``MARIN_SECRET_NAMES``).
#: Slurm and local jobs inherit the whole environment anyway; a Ray worker has its node's. Secret
#: values are never part of the job's record: iris keeps their names and hands the values over at launch.
FORWARDED_PREFIXES = ("MARIN_", "AWS_", "GOOGLE_", "GCS_", "STORAGE_EMULATOR_HOST", "FSSPEC_", "HF_", "TRANSFORMERS_",
                      "JAX_", "XLA_FLAGS", "WANDB_", "TOKENIZERS_")
# How long the runner gives a stopping job to checkpoint and end before it gives up waiting.
STOP_TIMEOUT_S = 120.0
# How often a step's replicas heartbeat and check the step's fence: a fenced-off replica stops
# within about this long.
REPLICA_HEARTBEAT_S = 2.0
# The time limit of a step's Slurm jobs when neither the step (ResourceConfig.time_limit_s) nor its
# partition sets one: a job of a step never runs unbounded.
DEFAULT_SLURM_TIME_LIMIT_S = 24 * 3600.0
# How long a step's job may take to start its first attempt (its supervisor waits for a place on
# the engine) before the runner stops it: as long as fray's SlurmClient waits for an allocation.
START_TIMEOUT_S = 1800.0


class StepJobFailed(MarinError, RuntimeError):
    """A step's iris job ended without success: its budgets are spent, or it could not be placed."""


@dataclass(frozen=True)
class IrisEngine:
    """Where iris places steps: an engine setting (``slurm``, ``slurm:gpu``, ``ray``, ``ray:autoscaling``,
    ``local``...)."""

    setting: str

    def __post_init__(self) -> None:
        engine_options(self.setting)  # refuse an unknown engine where the setting is read

    @property
    def options(self) -> dict[str, Any]:
        return engine_options(self.setting)


class IrisStepExecutor:
    """Runs each step as an iris job on ``engine``; see the module docstring."""

    keeps_attempt_logs = True
    commits_itself = True

    def __init__(self, engine: IrisEngine | str, *, store: JobStore | None = None, prefix: str | None = None,
                 poll_s: float = 0.5, replica_heartbeat_s: float = REPLICA_HEARTBEAT_S,
                 progress_every_s: float | None = None, start_timeout_s: float | None = None) -> None:
        self.engine = engine if isinstance(engine, IrisEngine) else IrisEngine(engine)
        self._store = store
        self._prefix = prefix
        self.poll_s = poll_s
        self.progress_every_s = progress_every_s  # None: progress_relay.PROGRESS_EVERY_S
        self.replica_heartbeat_s = replica_heartbeat_s
        self.start_timeout_s = START_TIMEOUT_S if start_timeout_s is None else start_timeout_s
        self._slurm: Any = None
        self._adopted: dict[str, JobStore] = {}  # job id -> the database an adopted job is recorded in

    @property
    def store(self) -> JobStore:
        # Opened on first use, so a dry run (which never runs a step) creates no iris folder.
        if self._store is None:
            # Where `iris job list` looks: $IRIS_HOME, else <prefix>/.iris of the runner's own (local) prefix.
            local_prefix = self._prefix is not None and fsx.is_local(self._prefix) and not os.environ.get(IRIS_HOME_VARIABLE)
            self._store = JobStore(fsx.join(self._prefix.removeprefix("file://"), ".iris") if local_prefix else None)
        return self._store

    def __repr__(self) -> str:
        return f"IrisStepExecutor({self.engine.setting!r})"

    def live_job(self, output_path: str, status: Any) -> str | None:
        """The iris job a RUNNING status names, if it still runs: looked up in the database the status
        names (the one it was submitted to), else in this runner's own."""
        if status.status != STATUS_RUNNING or not status.job:
            return None
        store = self.store
        if status.iris_home and Path(status.iris_home).expanduser().resolve() != store.home:
            store = JobStore(status.iris_home, create=False)
        if store.get(status.job) is None:  # a database this machine cannot see: the step folder tells the rest
            return None
        if get_job(status.job, store).state.finished:
            return None
        self._adopted[status.job] = store
        return status.job

    def end_execution(self, output_path: str, record: Any) -> None:
        """End what execution ``record`` names (fenced off already) runs on the engine: its iris job,
        if its database is within reach and it still runs; on Slurm, every job tagged with the step
        and a generation up to the record's (a job submitted by a runner that died before it could
        name it, a replica that never started). Bounded; a Slurm that cannot be asked is logged."""
        store = (self._adopted.get(record.job) or self._store_of(record)) if record.job else None
        self._end(output_path, record.generation, record.job, store, str(record.engine or ""))

    def _end(self, output_path: str, generation: int, job_id: str | None, store: JobStore | None, engine: str) -> None:
        if self.engine.options["backend"] == "slurm" or engine.startswith("slurm"):
            # First: a supervisor still pending on Slurm never reads a stop request.
            cancel_tagged_slurm_jobs(output_path, generation, self.engine.options.get("slurm_partition"))
        if job_id and store is not None and store.get(job_id) is not None and not get_job(job_id, store).state.finished:
            logger.info("Stopping iris job %s of execution g%d: %s", job_id, generation, output_path)
            stop_job(job_id, store, timeout=FENCE_WAIT_S)

    def _store_of(self, record: Any) -> JobStore | None:
        if record.iris_home and Path(record.iris_home).expanduser().resolve() != self.store.home:
            return JobStore(record.iris_home, create=False) if Path(record.iris_home).expanduser().exists() else None
        return self.store

    def run(self, call: StepCall) -> Any:
        spec, execution = call.spec, call.execution
        job_id = call.previous_job
        store = self._adopted.get(job_id, self.store) if job_id is not None else self.store
        if job_id is not None:
            logger.info("Step %s: iris job %s from an earlier runner is still running (execution g%d, %s); waiting for it",
                        spec.name, job_id, execution.generation, _where_it_runs(get_job(job_id, store)))
        else:
            self._check_fits(spec.name, spec.resources)
            url = call_url(call.output_path, execution.generation)
            job_call = StepJobCall(spec, call.output_path, dict(call.dep_output_paths), execution.to_json(), self._prefix,
                                   self.replica_heartbeat_s)
            fsx.atomic_write(url, cloudpickle.dumps(job_call))
            job_id = submit_job(self._job_spec(call, url), store)
            logger.info("Step %s runs as iris job %s on %s (execution g%d)", spec.name, job_id, self.engine.setting,
                        execution.generation)
            if call.placed is not None:
                # Recorded before its first attempt starts, so a runner that dies from here on
                # leaves a job the next runner adopts instead of starting the step a second time.
                call.placed(job=job_id, attempt=None, engine=self.engine.setting, iris_home=str(store.home))
        record = self._wait(call, job_id, store)
        status = read_status(call.output_path)
        if record.state is JobState.SUCCEEDED and status is not None and status.status == STATUS_SUCCESS \
                and status.generation == execution.generation:
            with fsx.open_url(result_url(call.output_path, execution.generation), "rb") as handle:
                return cloudpickle.load(handle)
        raise StepJobFailed(self._failure_message(call, record))

    # -- submitting ---------------------------------------------------------------------------------

    def _job_spec(self, call: StepCall, url: str) -> JobSpec:
        resources = call.spec.resources or ResourceConfig()
        secrets = SecretNames.from_environment()  # a malformed MARIN_SECRET_NAMES fails the step, saying why
        env = {name: value for name, value in os.environ.items()
               if name.startswith(FORWARDED_PREFIXES) or secrets.is_named(name)}
        env["MARIN_CLUSTER"] = "local"  # a step's own sub-work runs in its allocation
        return JobSpec(
            name=f"{safe_name_from(call.spec.name)}-{call.spec.short_hash}",
            command=(sys.executable, "-m", "marin.execution.running.step_job", url),
            resources=resources,
            replicas=resources.replicas,
            max_retries_failure=resources.max_retries_failure,
            max_retries_preemption=resources.max_retries_preemption,
            time_limit_s=resources.time_limit_s or self._default_time_limit_s(),
            tag=execution_tag(call.output_path, call.execution.generation),
            cwd=os.getcwd(),
            env=tuple(sorted(env.items())),
            attempts_folder=call.output_path,
            **self.engine.options,
        )

    def _default_time_limit_s(self) -> float | None:
        """The time limit of a step that sets none: on Slurm, where a job must not run for ever, the
        partition's own (Slurm applies it: None here), else :data:`DEFAULT_SLURM_TIME_LIMIT_S` for a
        partition without one. Other engines hold none."""
        if self.engine.options["backend"] != "slurm" or self._slurm is None:
            return None
        return None if self._slurm.partition_time_limit_s() is not None else DEFAULT_SLURM_TIME_LIMIT_S

    def check_placement(self, specs: list[Any]) -> None:
        """Before any step runs: the job database opens, and (on Slurm) every step's resources fit a
        partition and the controller answers. Raises ``ClusterConfigError``, one line naming the setting."""
        from fray.cluster import ClusterConfigError
        from fray.errors import FrayError
        from iris.errors import IrisError

        try:
            self.store  # noqa: B018 - opens (or creates) iris's database
            for spec in specs:
                self._check_fits(spec.name, spec.resources)
        except (FrayError, IrisError) as exc:
            raise ClusterConfigError(f"Steps cannot run through iris on {self.engine.setting!r}: {exc}") from None

    def _check_fits(self, name: str, resources: ResourceConfig | None) -> None:
        """Before anything is submitted: Slurm refuses a request no partition can hold; Ray one that no
        live node and no node type of the cluster's autoscaler can hold, and says here, on the runner's
        console, which node an autoscaled step waits for (the job's supervisor holds the deadline).
        A private Ray cluster per job (``ray:local``) and the local engine are checked by the supervisor."""
        options = self.engine.options
        what = f"Step {name!r}"
        if options["backend"] == "ray" and options.get("ray_address") is not None:
            from fray.cluster import client_for

            client_for(self.engine.setting, what="iris engine").check_fits(resources or ResourceConfig(), what=what)
            return
        if options["backend"] != "slurm":
            return
        if self._slurm is None:
            from fray.cluster.slurm_client import SlurmClient

            self._slurm = SlurmClient(options.get("slurm_partition"))  # it keeps what sinfo said for a while
        self._slurm.check_fits(resources or ResourceConfig(), what=what)

    # -- waiting ------------------------------------------------------------------------------------

    def _wait(self, call: StepCall, job_id: str, store: JobStore) -> Any:
        reported: int | None = None
        news = _AttemptNews(call.spec.name, call.output_path, job_id)
        progress = ProgressRelay(call.spec.name, call.output_path, job_id, every_s=self.progress_every_s)
        progress.announce()
        started = time.monotonic()
        while True:
            record = get_job(job_id, store)
            if not record.attempts and not record.state.finished and time.monotonic() - started > self.start_timeout_s:
                where = _where_it_runs(record)
                self._end(call.output_path, call.execution.generation, job_id, store, self.engine.setting)
                raise StepJobFailed(f"iris job {job_id} ({where}) did not start within {self.start_timeout_s:g} s; stopped it. "
                                    "Is the cluster full? (IrisStepExecutor(start_timeout_s=...) waits longer)")
            if record.attempts and record.attempts != reported and call.placed is not None:
                folder_attempt = _folder_attempt(call.output_path, job_id, record.attempts)
                if folder_attempt is not None:  # the supervisor opens the folder just after the attempt starts
                    reported = record.attempts
                    call.placed(attempt=folder_attempt)
            # How an attempt ended is told before the next attempt's log is read, each ended attempt's last
            # figures just before its line (the relay reads its log then, if it had not yet).
            news.tell(record, store, before=progress.ended)
            if record.attempts:
                progress.poll(record.attempts)
            if record.state.finished:
                progress.flush()
                return record
            if call.cancelled.is_set() or call.lease_lost.is_set():
                stop_job(job_id, store, timeout=STOP_TIMEOUT_S)
                name = call.spec.name
                if call.cancelled.is_set():
                    raise RunCancelled(f"The run was interrupted; stopped step {name!r}'s iris job {job_id}.")
                raise LeaseLostError(f"Step {name!r} lost its lease on {call.output_path}; stopped its iris job {job_id}.")
            time.sleep(self.poll_s)

    def _failure_message(self, call: StepCall, record: Any) -> str:
        text = f"iris job {record.job_id} {record.state.value.lower()}: {record.message}"
        tail = _log_tail(call.output_path, record.job_id)
        if tail:
            text += f"\nLast lines of its log:\n{tail}"
        return text + f"\nEvery attempt's log: marin logs {call.output_path}"


def _where_it_runs(record: JobRecord) -> str:
    """Where a job's supervisor runs, in words: what a person looks up to see why it waits."""
    if record.supervisor_job:
        try:
            locator = json.loads(record.supervisor_job)
        except ValueError:
            locator = {}
        if locator.get("backend") == "slurm":
            return f"its supervisor is Slurm job {locator.get('slurm_id')}"
        if locator.get("backend") == "ray":
            return f"its supervisor is Ray actor {locator.get('actor')}"
    if record.supervisor_pid:
        return f"its supervisor is pid {record.supervisor_pid}"
    return "no supervisor yet"


class _AttemptNews:
    """Says on the runner's console, once each, how the attempts of a step's job ended and what
    iris does next: a preemption is retried without the step failing, and would otherwise go unseen."""

    def __init__(self, step: str, output_path: str, job_id: str) -> None:
        self.step = step
        self.output_path = output_path
        self.job_id = job_id
        self._told: set[int] = set()
        self._seen: tuple[Any, ...] | None = None

    def tell(self, record: JobRecord, store: JobStore, before: Callable[[int], None] = lambda attempt: None) -> None:
        """Log how each attempt that ended since the last look ended; ``before(attempt)`` runs before each one's line."""
        seen = (record.attempts, record.preemptions, record.failures, record.state, record.updated_at)
        if seen == self._seen:  # nothing ended since the last look: no need to read the attempts
            return
        self._seen = seen
        spec = record.spec
        verdicts = replay(((a.attempt, a.outcome, a.exit_codes) for a in store.attempts(self.job_id)),
                          max_retries_preemption=spec.max_retries_preemption, max_retries_failure=spec.max_retries_failure)
        for verdict in verdicts:
            if verdict.attempt in self._told:
                continue
            before(verdict.attempt)
            self._told.add(verdict.attempt)
            if verdict.outcome is AttemptOutcome.SUCCEEDED and verdict.attempt == 1:
                continue  # the runner's own "finished" line says it all
            # The number of the step's attempt folder, which `marin logs --attempt` takes.
            number = _folder_attempt(self.output_path, self.job_id, verdict.attempt) or verdict.attempt
            line = f"Step {self.step}: attempt {number} {verdict.describe()}"
            if verdict.outcome.spends_failure_budget and not verdict.fenced_off:
                line += f"; its log: marin logs {self.step} --attempt {number}"
            logger.log(logging.INFO if verdict.outcome is AttemptOutcome.SUCCEEDED else logging.WARNING, "%s", line)


def _folder_attempt(output_path: str, job_id: str, job_attempt: int) -> int | None:
    """The number of the step's attempt folder holding ``job_id``'s attempt ``job_attempt``."""
    for listing in reversed(list_attempts(output_path)):
        record = listing.record
        if record is not None and record.job_id == job_id and record.job_attempt == job_attempt:
            return listing.attempt
    return None


def _log_tail(output_path: str, job_id: str, lines: int = 15) -> str:
    for listing in reversed(list_attempts(output_path)):
        if listing.record is not None and listing.record.job_id == job_id and listing.logs:
            text = read_log(listing.logs[0]).decode("utf-8", errors="replace")
            return "\n".join(text.rstrip().splitlines()[-lines:])
    return ""
