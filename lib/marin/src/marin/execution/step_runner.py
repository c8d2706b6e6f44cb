"""Run a DAG of steps once each, in dependency order, with bounded concurrency and caching.

``StepRunner().run(steps)``:

1. collects every transitive dependency of the steps and lazy handles it is given, refusing
   cycles, two different steps with one identity (:mod:`~marin.execution.planning.step_graph`), and two
   identities sharing one output folder;
2. plans (:mod:`~marin.execution.planning.step_plan`): a step whose ``.executor_status`` is SUCCESS *for its identity* is *cached* and skipped;
   a FAILED one is rerun when ``force_run_failed`` (the default) and otherwise reported failed. A
   folder whose records name another identity is never reused, and cached outputs made by other
   code are reported or, with ``strict``, refused (:mod:`~marin.execution.planning.output_reuse`);
3. runs the rest in topological order, at most ``max_concurrent`` at a time (default
   :data:`DEFAULT_MAX_CONCURRENT`; each step waits in a thread of this process), each as one
   :mod:`~marin.execution.scheduling.step_attempt` under a lease, so that two runners on one prefix never
   run a step twice (:mod:`~marin.execution.scheduling.step_scheduler`);
4. marks every dependent of a failed step DEP_FAILED without running it; independent branches
   still finish;
5. returns a :class:`RunReport`, or raises :class:`StepRunFailed` (carrying the report) once all
   runnable work is done, if any step failed. ``raise_on_failure=False`` returns the report instead.

Step functions run where :mod:`marin.execution.running.step_executor` sends them: in the runner's threads
by default, or through a fray client (``StepRunner(client=RayClient())`` or ``MARIN_CLUSTER``) with
each step's ``resources``. Ctrl-C and SIGTERM stop a run as :mod:`~marin.execution.ownership.interrupts`
says; ``marin run``'s options reach the runner as :mod:`~marin.execution.planning.run_defaults` says. A
prefix that can never hold outputs is refused before anything runs
(:mod:`~marin.execution.planning.prefix_check`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent import futures
from typing import Any

from fray.cluster import ClusterConfigError, DistributedClient, client_for, current_client
from fray.cluster.current import configured_cluster, split_orchestrator
from rigging import filesystem as fsx
from rigging.config.discovery import discover_config
from rigging.lease import DEFAULT_TTL_S
from rigging.log import get_logger, is_configured, setup_logging

from marin.errors import MarinError
from marin.execution.artifact import result_summary
from marin.execution.scheduling.engine_slots import EngineSlots, local_slots
from marin.execution.records.executor_files import STATUS_FAILED
from marin.execution.ownership.interrupts import Interrupt, RunInterruption, RunInterrupts
from marin.execution.planning.output_reuse import (
    CodeChangedError,
    OutputPathConflict,
    UnverifiedOutputError,
    report_changed_code,
)
from marin.execution.planning.prefix_check import PrefixNotWritableError, check_prefix
from marin.execution.planning.run_defaults import (
    DEFAULT_MAX_CONCURRENT,
    RunOptionError,
    RunOptions,
    RunOverrides,
    current_launch,
    resolve_options,
)
from marin.execution.records.run_report import Outcome, RunReport, StepOutcome, StepRunFailed
from marin.execution.scheduling.step_attempt import RunSession
from marin.execution.running.step_context import LeaseLostError
from marin.execution.running.step_executor import StepExecutor, executor_for
from marin.execution.planning.step_graph import StepGraphError, flatten_steps
from marin.execution.planning.step_plan import Plan, PlannedStep, plan_steps, print_dry_run
from marin.execution.scheduling.step_scheduler import schedule_steps
from marin.execution.step_spec import StepSpec

logger = get_logger(__name__)

# How many cached steps a run names one by one before it only counts the rest.
_CACHED_NAMED = 20


class StepRunner:
    """Runs steps under ``prefix`` (default: :func:`rigging.config.discovery.discover_config`).

    ``lease_ttl_s`` is how long a silent runner's lease survives before others take its steps
    over (a crashed runner on the same host is detected at once); ``poll_s`` is how often a
    runner waiting on another's step looks again. ``client`` is the fray client step functions run
    on (default: :func:`fray.cluster.current_client`: threads of this process unless configured
    otherwise, e.g. ``MARIN_CLUSTER=ray:auto``). ``cluster`` is a cluster setting for this runner
    instead of the configured one: ``"iris:slurm"`` (any ``iris:ENGINE``) runs each step as an iris
    job with retries (:mod:`~marin.execution.running.iris_steps`), any other setting names the client steps
    run on. ``strict`` refuses to reuse cached outputs made
    by other code than the steps' functions now (see :meth:`run`). ``overrides`` beat every other
    option (default: those of the ``marin run`` in progress, if any; see
    :mod:`marin.execution.planning.run_defaults`).

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
            # fsx.join's result: a step name is never empty, absolute or a URL (the spec refuses those).
            return f"{self.prefix.rstrip('/')}/{spec.name}-{spec.short_hash}"
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
        check_prefix(self.prefix, self._prefix_source, writing=not options.dry_run)
        plan = self._plan(steps, run_only=options.run_only, read_every_step=options.strict)
        planned = plan.steps
        logger.info(
            "Running %d step(s) under %s (%d already done%s)", len(planned), self.prefix, sum(p.cached for p in planned),
            f"; {len(plan.not_needed)} more not needed, only finished steps depend on them" if plan.not_needed else "",
        )
        report_changed_code([(item.spec, item.output_path) for item in planned if item.code_changed], strict=options.strict)
        report = RunReport(dry_run=options.dry_run, prefix=self.prefix)
        if options.dry_run:
            print_dry_run(plan, prefix=self.prefix, force_run_failed=options.force_run_failed, report=report)
            return report
        check_placement = getattr(executor, "check_placement", None)
        if check_placement is not None:
            # Requests no node can hold, a scheduler that does not answer: said once, before any step starts.
            check_placement([item.spec for item in planned if not item.cached])
        self._execute(planned, options, report, executor)
        finished = {outcome.identity for outcome in report.outcomes if outcome.outcome.succeeded}
        report.add_not_needed(plan.not_needed)
        if logger.isEnabledFor(logging.INFO):  # the summary reads every step's attempt records: not for a line not shown
            logger.info("Run finished: %s", report.summary())
        self._print_final_summaries(planned, finished)
        if raise_on_failure and not report.ok:
            raise StepRunFailed(report)
        return report

    # -- planning ---------------------------------------------------------------------------------

    def plan(self, steps: Iterable[Any], *, run_only: str | None = None) -> list[PlannedStep]:
        """The steps ``run`` needs, in topological order, with output paths and current status.

        Dependencies that only finished steps depend on are left out (a run neither reads nor runs
        them). Reads one status file per needed step (plus ``.executor_info`` for explicit output
        paths) and writes nothing. Raises on cycles, identity clashes and output-path conflicts.
        """
        return self._plan(steps, run_only=run_only).steps

    def _plan(self, steps: Iterable[Any], *, run_only: str | None, read_every_step: bool = False) -> Plan:
        return plan_steps(
            steps,
            run_only=run_only,
            output_path_for=self.output_path_for,
            existing_outputs=self.existing_outputs,
            read_every_step=read_every_step,
        )

    # -- scheduling -------------------------------------------------------------------------------

    def _executor(self) -> StepExecutor:
        """Where steps run: the runner's client, else its cluster setting, else the configured one."""
        if self.client is not None:
            return executor_for(self.client)
        setting = self.cluster if self.cluster is not None else configured_cluster()
        orchestrator, engine = split_orchestrator(setting or "")
        if orchestrator == "iris":
            from iris.spec import InvalidJobSpec

            from marin.execution.running.iris_steps import IrisStepExecutor

            try:
                return IrisStepExecutor(engine, prefix=self.prefix)
            except InvalidJobSpec as exc:
                where = "StepRunner(cluster=...)" if self.cluster is not None else "MARIN_CLUSTER or cluster: in marin.yaml"
                raise ClusterConfigError(f"The cluster setting {setting!r} ({where}) names no engine iris knows: {exc}") from None
        return executor_for(client_for(self.cluster, what="cluster") if self.cluster is not None else current_client(setting))

    def _execute(self, planned: list[PlannedStep], options: RunOptions, report: RunReport, executor: StepExecutor) -> None:
        outcomes: dict[str, StepOutcome] = {}
        pending: list[PlannedStep] = []
        cached = 0
        for item in planned:
            spec, status = item.spec, item.status
            if item.cached:
                outcomes[spec.identity] = item.outcome(Outcome.CACHED)
                cached += 1
                if cached <= _CACHED_NAMED:
                    logger.info("Step %s cached: %s", spec.name, item.output_path)
            elif status is not None and status.status == STATUS_FAILED and not options.force_run_failed:
                error = f"failed in an earlier run ({status.error}); not rerun because force_run_failed is off"
                outcomes[spec.identity] = item.outcome(Outcome.FAILED, error=error)
                logger.error("Step %s %s: %s", spec.name, error, item.output_path)
            else:
                pending.append(item)
        if cached > _CACHED_NAMED:
            # A sweep's rerun is thousands of cached steps: a line each would bury the ones that run.
            logger.info("... and %d more cached step(s) (`marin status` lists every step)", cached - _CACHED_NAMED)

        if pending:
            self._run_pending(pending, planned, outcomes, options.max_concurrent, executor)
        report.outcomes.extend(outcomes[item.spec.identity] for item in planned if item.spec.identity in outcomes)

    def _run_pending(
        self,
        pending: list[PlannedStep],
        planned: list[PlannedStep],
        outcomes: dict[str, StepOutcome],
        workers: int,
        executor: StepExecutor,
    ) -> None:
        """Run the ``pending`` steps, ``workers`` at a time, as their dependencies finish; each
        step's outcome goes into ``outcomes``."""
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
            slots=EngineSlots(local_slots() if fsx.is_local(self.prefix) else None),
        )
        running: dict[futures.Future, PlannedStep] = {}
        paths = {item.spec.identity: item.output_path for item in planned}
        with (
            futures.ThreadPoolExecutor(max_workers=max(1, min(workers, len(pending))), thread_name_prefix="marin-step") as pool,
            RunInterrupts(session.cancelled, running) as interrupts,
        ):
            try:
                schedule_steps(session, pool, pending, running, outcomes, paths, workers)
            except KeyboardInterrupt:  # raised where no handler could be installed (not the main thread)
                interrupts.stop_steps(Interrupt.CTRL_C)
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        interrupts.raise_if_interrupted()

    def _print_final_summaries(self, planned: list[PlannedStep], finished: set[str]) -> None:
        """Print what the run produced: the ``summary()`` of each final step's result, if it has one
        (``finished``: the identities of the steps whose output is there).

        Final steps are those no other planned step depends on (the model, not its data), so a
        cached rerun shows the same summary as the run that made it.
        """
        depended_on = {dep.identity for item in planned for dep in item.spec.deps}
        for item in planned:
            if item.spec.identity in depended_on or item.spec.identity not in finished:
                continue
            text = result_summary(item.output_path)
            if text:
                print(f"\n== {item.spec.name} ({item.output_path})\n{text}", flush=True)


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
