"""Run a DAG of steps once each, in dependency order, with bounded concurrency and caching.

``StepRunner().run(steps)``:

1. collects every transitive dependency of the steps and lazy handles it is given, refusing
   cycles, two different steps with one identity (:mod:`~marin.execution.step_graph`), and two
   identities sharing one output folder;
2. plans: a step whose ``.executor_status`` is SUCCESS *for its identity* is *cached* and skipped;
   a FAILED one is rerun when ``force_run_failed`` (the default) and otherwise reported failed. A
   folder whose records name another identity is never reused, and cached outputs made by other
   code are reported or, with ``strict``, refused (:mod:`~marin.execution.output_reuse`);
3. runs the rest in topological order, at most ``max_concurrent`` at a time (default
   :data:`DEFAULT_MAX_CONCURRENT`; each step waits in a thread of this process), each as one
   :mod:`~marin.execution.step_attempt` under a lease, so that two runners on one prefix never
   run a step twice;
4. marks every dependent of a failed step DEP_FAILED without running it; independent branches
   still finish;
5. returns a :class:`RunReport`, or raises :class:`StepRunFailed` (carrying the report) once all
   runnable work is done, if any step failed. ``raise_on_failure=False`` returns the report instead.

Step functions run where :mod:`marin.execution.step_executor` sends them: in the runner's threads
by default, or through a fray client (``StepRunner(client=RayClient())`` or ``MARIN_CLUSTER``) with
each step's ``resources``. Ctrl-C and SIGTERM stop a run as :mod:`~marin.execution.interrupts`
says; ``marin run``'s options reach the runner as :mod:`~marin.execution.run_defaults` says.
"""

from __future__ import annotations

import heapq
import logging
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from fray.cluster import ClusterConfigError, DistributedClient, client_for, current_client
from fray.cluster.current import configured_cluster, split_orchestrator
from rigging import conditional_writes
from rigging import filesystem as fsx
from rigging.config.discovery import discover_config
from rigging.lease import DEFAULT_TTL_S
from rigging.log import get_logger, is_configured, setup_logging

from marin.errors import MarinError
from marin.execution.artifact import result_summary
from marin.execution.executor_files import (
    LOCK_FILE,
    STATUS_FAILED,
    STATUS_SUCCESS,
    StatusRecord,
    read_status,
)
from marin.execution.interrupts import Interrupt, RunInterruption, RunInterrupts
from marin.execution.output_reuse import (
    CodeChangedError,
    OutputPathConflict,
    UnverifiedOutputError,
    check_recorded_identity,
    made_by_other_code,
    report_changed_code,
)
from marin.execution.run_defaults import (
    DEFAULT_MAX_CONCURRENT,
    RunOptionError,
    RunOptions,
    RunOverrides,
    current_launch,
    resolve_options,
)
from marin.execution.run_report import Outcome, RunReport, StepOutcome, StepRunFailed
from marin.execution.step_attempt import RunSession, attempt_step, record_dep_failed
from marin.execution.step_context import LeaseLostError
from marin.execution.step_executor import StepExecutor, executor_for
from marin.execution.step_graph import (
    StepGraphError,
    collect_steps,
    flatten_steps,
    topological_order,
)
from marin.execution.step_spec import StepSpec

logger = get_logger(__name__)

# How often the scheduler looks for an interrupt while long steps run.
_WAIT_POLL_S = 0.5


class PrefixNotWritableError(RunOptionError):
    """The output prefix is a local path where step outputs cannot be written."""


@dataclass
class PlannedStep:
    """One step of a plan: the spec, where its output goes, and its status when planned.

    A SUCCESS status in a plan is always this spec's own: planning refuses folders that hold
    another identity's output.
    """

    spec: StepSpec
    output_path: str
    status: StatusRecord | None

    @property
    def cached(self) -> bool:
        return self.status is not None and self.status.status == STATUS_SUCCESS

    @property
    def code_changed(self) -> bool:
        """Cached, and made by code other than the step's function now (when the two can be compared)."""
        return self.cached and made_by_other_code(self.spec, self.status)


class StepRunner:
    """Runs steps under ``prefix`` (default: :func:`rigging.config.discovery.discover_config`).

    ``lease_ttl_s`` is how long a silent runner's lease survives before others take its steps
    over (a crashed runner on the same host is detected at once); ``poll_s`` is how often a
    runner waiting on another's step looks again. ``client`` is the fray client step functions run
    on (default: :func:`fray.cluster.current_client`: threads of this process unless configured
    otherwise, e.g. ``MARIN_CLUSTER=ray:auto``). ``cluster`` is a cluster setting for this runner
    instead of the configured one: ``"iris:slurm"`` (any ``iris:ENGINE``) runs each step as an iris
    job with retries (:mod:`~marin.execution.iris_steps`), any other setting names the client steps
    run on. ``strict`` refuses to reuse cached outputs made
    by other code than the steps' functions now (see :meth:`run`). ``overrides`` beat every other
    option (default: those of the ``marin run`` in progress, if any; see
    :mod:`marin.execution.run_defaults`).

    ``existing_outputs`` maps step identities to finished outputs elsewhere (another prefix): such a
    step is never run and nothing is written to its folder; its dependents read it there, and its
    own dependencies are not planned. ``marin reproduce`` reruns a step in a scratch prefix so,
    reading its inputs from the original one.
    """

    def __init__(
        self,
        prefix: str | None = None,
        *,
        lease_ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float | None = None,
        poll_s: float = 0.5,
        client: DistributedClient | None = None,
        cluster: str | None = None,
        strict: bool = False,
        overrides: RunOverrides | None = None,
        existing_outputs: Mapping[str, str] | None = None,
    ) -> None:
        self._launch = current_launch()
        if overrides is None:
            overrides = self._launch.overrides if self._launch is not None else RunOverrides()
        self.overrides = overrides
        config = discover_config(prefix=overrides.prefix or prefix)
        self.prefix = config.prefix
        self._prefix_source = config.source_of("prefix")
        self.lease_ttl_s = lease_ttl_s
        self.heartbeat_s = heartbeat_s
        self.poll_s = poll_s
        self.runner_id = uuid.uuid4().hex[:12]
        # Where step functions run; None: fray's current client when a run starts (see step_executor).
        self.client = client
        self.cluster = cluster
        self.strict = strict
        self.existing_outputs = dict(existing_outputs or {})

    def output_path_for(self, spec: StepSpec) -> str:
        """``<prefix>/<name>-<short hash>``, or the step's explicit ``output_path`` (relative ones under the prefix)."""
        if spec.output_path is None:
            return fsx.join(self.prefix, f"{spec.name}-{spec.short_hash}")
        if "://" in spec.output_path or spec.output_path.startswith("/"):
            return spec.output_path.rstrip("/")
        return fsx.join(self.prefix, spec.output_path.rstrip("/"))

    # -- running ----------------------------------------------------------------------------------

    def run(
        self,
        steps: Iterable[Any],
        *,
        dry_run: bool | None = None,
        force_run_failed: bool | None = None,
        run_only: str | None = None,
        max_concurrent: int | None = None,
        raise_on_failure: bool = True,
        strict: bool | None = None,
    ) -> RunReport:
        """Run ``steps`` (StepSpecs, lazy handles, or lists of them) and all their dependencies.

        ``run_only`` is a regular expression: only steps whose name it matches (``re.search``),
        plus their dependencies, are considered. ``strict`` (default: the runner's ``strict``)
        refuses to reuse cached outputs made by other code than the steps' functions now. Options
        given to ``marin run`` on the command line take precedence over these arguments.
        """
        if self._launch is not None:
            if self._launch.runs_started == 0:
                self._launch.refuse_unread_settings()
            self._launch.runs_started += 1
            if self._launch.take_run is not None:
                # The launcher asked for the script's steps, not for a run (marin reproduce).
                return self._launch.take_run(self, flatten_steps(steps, taker="StepRunner.run"))
        options = resolve_options(
            self.overrides,
            dry_run=dry_run,
            force_run_failed=force_run_failed,
            run_only=run_only,
            max_concurrent=max_concurrent,
            strict=strict,
            runner_strict=self.strict,
        )
        _ensure_logging()
        executor = self._executor()  # a cluster setting that names nothing fails before anything is read
        self._check_prefix(writing=not options.dry_run)
        planned = self.plan(steps, run_only=options.run_only)
        logger.info("Running %d step(s) under %s (%d already done)", len(planned), self.prefix, sum(p.cached for p in planned))
        report_changed_code([(item.spec, item.output_path) for item in planned if item.code_changed], strict=options.strict)
        report = RunReport(dry_run=options.dry_run, prefix=self.prefix)
        if options.dry_run:
            self._dry_run(planned, options.force_run_failed, report)
            return report
        check_placement = getattr(executor, "check_placement", None)
        if check_placement is not None:
            # Requests no node can hold, a scheduler that does not answer: said once, before any step starts.
            check_placement([item.spec for item in planned if not item.cached])
        self._execute(planned, options, report, executor)
        logger.info("Run finished: %s", report.summary())
        self._print_final_summaries(planned)
        if raise_on_failure and not report.ok:
            raise StepRunFailed(report)
        return report

    # -- planning ---------------------------------------------------------------------------------

    def plan(self, steps: Iterable[Any], *, run_only: str | None = None) -> list[PlannedStep]:
        """The steps ``run`` would consider, in topological order, with output paths and current status.

        Reads one status file per step (plus ``.executor_info`` for explicit output paths) and
        writes nothing. Raises on cycles, identity clashes and output-path conflicts.
        """
        roots = flatten_steps(steps, taker="StepRunner.run")
        specs = _select(_not_upstream_of(collect_steps(roots), roots, self.existing_outputs), run_only)
        planned = []
        owners: dict[str, StepSpec] = {}
        for spec in specs:
            output_path = self.existing_outputs.get(spec.identity) or self.output_path_for(spec)
            other = owners.setdefault(output_path, spec)
            if other is not spec:
                raise StepGraphError(
                    f"Steps {other.name!r} ({other.short_hash}) and {spec.name!r} ({spec.short_hash}) both write to "
                    f"{output_path}; give one of them another output_path."
                )
            status = read_status(output_path)
            check_recorded_identity(spec, output_path, status)
            if spec.identity in self.existing_outputs and (status is None or status.status != STATUS_SUCCESS):
                raise RunOptionError(
                    f"Step {spec.name!r} was given as finished at {output_path}, but its status there is "
                    f"{status.status if status else 'missing'}; run it to completion there first."
                )
            planned.append(PlannedStep(spec, output_path, status))
        return planned

    def _check_prefix(self, *, writing: bool) -> None:
        """Fail before any step starts if a prefix can never hold outputs.

        Otherwise the first status read or write fails deep inside the runner, once per step.
        A dry run writes nothing, so it only checks that the prefix is not inside a file. Object
        stores are checked for the conditional writes leases need, not probed: their permissions
        show on the first write.
        """
        if not fsx.is_local(self.prefix):
            if writing:
                try:
                    conditional_writes.check_conditional_writes(fsx.join(self.prefix, LOCK_FILE))
                except conditional_writes.ConditionalWritesUnsupportedError as exc:
                    raise PrefixNotWritableError(
                        f"Steps cannot run under the prefix {self.prefix}, set by "
                        f"{_describe_prefix_source(self._prefix_source)}: each running step holds a lease there, "
                        f"and {exc.protocol}:// cannot hold one safely ({exc.missing}). Use local disk, s3:// or gs://."
                    ) from None
            return
        path = self.prefix.removeprefix("file://")
        existing = path
        while not os.path.exists(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        problem = None
        if not os.path.isdir(existing):
            problem = f"{existing} is a file, not a folder" if existing == path else f"{existing} is a file, so no folder can be made under it"
        elif writing:
            try:
                os.makedirs(path, exist_ok=True)
                with tempfile.TemporaryFile(dir=path, prefix=".marin-write-check-"):
                    pass
            except OSError as exc:
                problem = f"{exc.strerror or exc} ({exc.filename or path})"
        if problem:
            raise PrefixNotWritableError(
                f"Step outputs cannot be written under the prefix {self.prefix}, set by "
                f"{_describe_prefix_source(self._prefix_source)}: {problem}. Point the prefix at a folder you can "
                "write: `export MARIN_PREFIX=$HOME/marin-outputs`, `marin run --prefix DIR`, StepRunner(prefix=DIR), "
                "or `prefix: DIR` in marin.yaml."
            )

    def _dry_run(self, planned: list[PlannedStep], force_run_failed: bool, report: RunReport) -> None:
        print(f"Dry run under {self.prefix}: {len(planned)} step(s)")
        blocked: set[str] = set()
        for item in planned:
            spec, status = item.spec, item.status
            if item.cached:
                outcome = Outcome.CACHED
            elif any(dep.identity in blocked for dep in spec.deps):
                outcome = Outcome.DEP_FAILED
            elif status is not None and status.status == STATUS_FAILED and not force_run_failed:
                outcome = Outcome.FAILED
            else:
                outcome = Outcome.WOULD_RUN
            if outcome.blocks_dependents:
                blocked.add(spec.identity)
            print(f"  {_DRY_RUN_LABELS[outcome]:<18} {spec.short_hash}  {spec.name:<40} {item.output_path}")
            report.outcomes.append(StepOutcome(spec.name, spec.identity, item.output_path, outcome))
        print(f"Dry run: {report.summary()}; nothing was written.")

    # -- scheduling -------------------------------------------------------------------------------

    def _executor(self) -> StepExecutor:
        """Where steps run: the runner's client, else its cluster setting, else the configured one."""
        if self.client is not None:
            return executor_for(self.client)
        setting = self.cluster if self.cluster is not None else configured_cluster()
        orchestrator, engine = split_orchestrator(setting or "")
        if orchestrator == "iris":
            from iris.spec import InvalidJobSpec

            from marin.execution.iris_steps import IrisStepExecutor

            try:
                return IrisStepExecutor(engine, prefix=self.prefix)
            except InvalidJobSpec as exc:
                where = "StepRunner(cluster=...)" if self.cluster is not None else "MARIN_CLUSTER or cluster: in marin.yaml"
                raise ClusterConfigError(f"The cluster setting {setting!r} ({where}) names no engine iris knows: {exc}") from None
        return executor_for(client_for(self.cluster, what="cluster") if self.cluster is not None else current_client())

    def _execute(self, planned: list[PlannedStep], options: RunOptions, report: RunReport, executor: StepExecutor) -> None:
        session = RunSession(
            prefix=self.prefix,
            runner_id=self.runner_id,
            started_at=time.time(),
            executor=executor,
            # Fresh per run: it records which signal (Ctrl-C or SIGTERM) stopped this run, and a
            # step still finishing from an earlier run keeps its own.
            cancelled=RunInterruption(),
            lease_ttl_s=self.lease_ttl_s,
            heartbeat_s=self.heartbeat_s,
            poll_s=self.poll_s,
        )
        outcomes: dict[str, StepOutcome] = {}
        pending: list[PlannedStep] = []
        for item in planned:
            spec, status = item.spec, item.status
            if item.cached:
                outcomes[spec.identity] = StepOutcome(spec.name, spec.identity, item.output_path, Outcome.CACHED)
                logger.info("Step %s cached: %s", spec.name, item.output_path)
            elif status is not None and status.status == STATUS_FAILED and not options.force_run_failed:
                error = f"failed in an earlier run ({status.error}); not rerun because force_run_failed is off"
                outcomes[spec.identity] = StepOutcome(spec.name, spec.identity, item.output_path, Outcome.FAILED, error=error)
                logger.error("Step %s %s: %s", spec.name, error, item.output_path)
            else:
                pending.append(item)

        workers = options.max_concurrent
        running: dict[futures.Future, PlannedStep] = {}
        paths = {item.spec.identity: item.output_path for item in planned}
        with (
            futures.ThreadPoolExecutor(max_workers=max(1, min(workers, len(pending))), thread_name_prefix="marin-step") as pool,
            RunInterrupts(session.cancelled, running) as interrupts,
        ):
            try:
                _schedule(session, pool, pending, running, outcomes, paths, workers)
            except KeyboardInterrupt:  # raised where no handler could be installed (not the main thread)
                interrupts.stop_steps(Interrupt.CTRL_C)
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        interrupts.raise_if_interrupted()
        report.outcomes.extend(outcomes[item.spec.identity] for item in planned if item.spec.identity in outcomes)

    def _print_final_summaries(self, planned: list[PlannedStep]) -> None:
        """Print what the run produced: the ``summary()`` of each final step's result, if it has one.

        Final steps are those no other planned step depends on (the model, not its data), so a
        cached rerun shows the same summary as the run that made it.
        """
        depended_on = {dep for item in planned for dep in item.spec.deps}
        for item in planned:
            if item.spec in depended_on:
                continue
            record = read_status(item.output_path)
            if record is None or record.status != STATUS_SUCCESS:
                continue
            text = result_summary(item.output_path)
            if text:
                print(f"\n== {item.spec.name} ({item.output_path})\n{text}", flush=True)


_DRY_RUN_LABELS = {
    Outcome.CACHED: "cached",
    Outcome.WOULD_RUN: "to run",
    Outcome.FAILED: "failed (not rerun)",
    Outcome.DEP_FAILED: "dep failed",
}


def _not_upstream_of(specs: list[StepSpec], roots: list[StepSpec], existing: Mapping[str, str]) -> list[StepSpec]:
    """``specs`` less the steps needed only by steps whose outputs exist elsewhere (never run here)."""
    if not existing:
        return specs
    needed: set[str] = set()
    stack = list(roots)
    while stack:
        spec = stack.pop()
        if spec.identity in needed:
            continue
        needed.add(spec.identity)
        if spec.identity not in existing:
            stack.extend(spec.deps)
    return [spec for spec in specs if spec.identity in needed]


def _select(specs: list[StepSpec], run_only: str | None) -> list[StepSpec]:
    """``specs`` whose name ``run_only`` matches, with their dependencies; all of them without it."""
    if not run_only:
        return specs
    try:
        pattern = re.compile(run_only)
    except re.error as exc:
        raise RunOptionError(f"run_only {run_only!r} is not a valid regular expression: {exc}") from exc
    chosen = [s for s in specs if pattern.search(s.name)]
    if not chosen:
        names = ", ".join(s.name for s in specs)
        raise RunOptionError(f"run_only {run_only!r} matches no step. Step names: {names}.")
    # By identity: a dependency may be a different (but equal) object from the one kept in specs.
    needed = {s.identity for s in topological_order(chosen)}
    return [s for s in specs if s.identity in needed]


def _schedule(
    session: RunSession,
    pool: futures.ThreadPoolExecutor,
    pending: list[PlannedStep],
    running: dict[futures.Future, PlannedStep],
    outcomes: dict[str, StepOutcome],
    paths: dict[str, str],
    workers: int,
) -> None:
    """Submit steps as their dependencies finish, in plan order among those ready; mark the
    dependents of failures DEP_FAILED.

    Each step counts its dependencies still to finish, and a finished step visits only its own
    dependents: a run of n steps costs time in proportion to its steps and edges, where rescanning
    every waiting step after each finished one would grow with n squared (minutes at 10,000 steps).
    """
    total = len(pending)
    position = {item.spec.identity: index for index, item in enumerate(pending)}
    waiting: dict[str, int] = {}  # identity -> dependencies not finished yet
    dependents: dict[str, list[PlannedStep]] = {}
    ready: list[tuple[int, PlannedStep]] = []  # a heap by position in the plan
    started: set[str] = set()
    stopping = False

    def block(item: PlannedStep) -> None:
        """Record ``item`` DEP_FAILED, and so every step waiting on it (iteratively: chains may be deep)."""
        stack = [item]
        while stack:
            step = stack.pop()
            if step.spec.identity in outcomes:
                continue
            states = (outcomes.get(dep.identity) for dep in step.spec.deps)
            culprits = [o.name for o in states if o is not None and o.outcome.blocks_dependents]
            outcomes[step.spec.identity] = record_dep_failed(session, step.spec, step.output_path, culprits)
            stack.extend(reversed(dependents.pop(step.spec.identity, [])))

    def settle(item: PlannedStep, outcome: StepOutcome) -> None:
        outcomes[item.spec.identity] = outcome
        if stopping:
            return  # interrupted: nothing new starts, and the steps never started keep their status
        for dependent in dependents.pop(item.spec.identity, []):
            if dependent.spec.identity in outcomes:
                continue
            if outcome.outcome.blocks_dependents:
                block(dependent)
                continue
            waiting[dependent.spec.identity] -= 1
            if waiting[dependent.spec.identity] == 0:
                heapq.heappush(ready, (position[dependent.spec.identity], dependent))

    for item in pending:  # dependencies come first in the plan, so their outcomes are known here if settled
        states = [outcomes.get(dep.identity) for dep in item.spec.deps]
        if any(o is not None and o.outcome.blocks_dependents for o in states):
            block(item)
            continue
        unfinished = [dep for dep, o in zip(item.spec.deps, states) if o is None]
        waiting[item.spec.identity] = len(unfinished)
        for dep in unfinished:
            dependents.setdefault(dep.identity, []).append(item)
        if not unfinished:
            heapq.heappush(ready, (position[item.spec.identity], item))

    finished = 0
    run_seconds = 0.0
    while True:
        if session.cancelled.is_set() and not stopping:
            # Interrupted: start nothing new, but collect the outcomes of the steps still stopping.
            stopping = True
            never = [i for i in pending if i.spec.identity not in outcomes and i.spec.identity not in started]
            if never:
                logger.warning("Interrupted: %d step(s) not started: %s", len(never), ", ".join(i.spec.name for i in never))
            ready.clear()
        while ready and len(running) < workers:
            _, item = heapq.heappop(ready)
            started.add(item.spec.identity)
            dep_paths = {dep.identity: paths[dep.identity] for dep in item.spec.deps}
            running[pool.submit(attempt_step, session, item.spec, item.output_path, dep_paths)] = item
        if not running:
            break  # done (or, with an invalid plan, nothing left that can start)
        # A timeout keeps the loop noticing an interrupt while long steps run.
        done, _ = futures.wait(list(running), timeout=_WAIT_POLL_S, return_when=futures.FIRST_COMPLETED)
        for future in done:
            item = running.pop(future)
            outcome = future.result()
            finished += 1
            run_seconds += outcome.seconds
            _log_progress(outcome, finished, total, run_seconds, workers)
            settle(item, outcome)


def _log_progress(outcome: StepOutcome, finished: int, total: int, run_seconds: float, workers: int) -> None:
    remaining = total - finished
    eta = run_seconds / finished * remaining / max(1, min(workers, remaining or 1))
    verb = _PROGRESS_VERBS.get(outcome.outcome, outcome.outcome)
    level = logger.error if outcome.outcome == Outcome.FAILED else logger.info
    level(f"Step %s {verb} in %.1fs: %s [%d/%d run, ETA %.0fs]", outcome.name, outcome.seconds, outcome.output_path, finished, total, eta)


_PROGRESS_VERBS = {Outcome.RAN: "finished", Outcome.CACHED: "was completed by another runner", Outcome.FAILED: "FAILED"}


def _ensure_logging() -> None:
    """Show the runner's progress lines unless the application chose its own logging set-up.

    A bare ``logging.basicConfig()`` handler at WARNING is not such a choice: absl installs one
    when orbax logs during import, which would otherwise hide every INFO line of a plain
    ``python script.py`` run.
    """
    root = logging.getLogger()
    if len(root.handlers) == 1 and root.level == logging.WARNING:
        handler = root.handlers[0]
        if type(handler) is logging.StreamHandler and getattr(handler.formatter, "_fmt", None) == logging.BASIC_FORMAT:
            root.removeHandler(handler)
    if not is_configured():
        setup_logging()


def _describe_prefix_source(source: str) -> str:
    if source == "argument":
        return "the prefix argument (or marin run --prefix)"
    if source.startswith("env:"):
        return f"the environment variable {source[4:]}"
    if source == "default":
        return "the default"
    return f"the prefix setting in {source}"


__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "CodeChangedError",
    "LeaseLostError",
    "Outcome",
    "OutputPathConflict",
    "PlannedStep",
    "PrefixNotWritableError",
    "RunOptionError",
    "RunReport",
    "StepGraphError",
    "StepOutcome",
    "StepRunFailed",
    "StepRunner",
    "UnverifiedOutputError",
]
