"""A run's plan: the steps it considers, where each one's output goes, and which are done already.

:func:`plan_steps` collects the steps and all their dependencies (less those ``run_only`` leaves
out), gives each its output folder, refuses two identities sharing one folder or a folder holding
another identity's output, and reads the status of each step the run needs; it writes nothing. It
plans from the steps asked for down: a step that is finished (or whose output exists elsewhere)
needs nothing from its dependencies, so a dependency that only finished steps depend on is *not
needed* and is not read at all (a strict plan reads every step, to check all their code).
:func:`print_dry_run` shows a plan as a dry run reports it: every step, its hash, its output folder
and what a run would do with it, and the compute the steps that declare it plan to spend (a
sweep's grid, with its total).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from marin.execution.records.executor_files import STATUS_FAILED, STATUS_SUCCESS, StatusRecord, read_status
from marin.execution.planning.output_reuse import check_recorded_identity, made_by_other_code
from marin.execution.planning.run_defaults import RunOptionError
from marin.execution.records.run_report import Outcome, RunReport, StepOutcome
from marin.execution.planning.step_graph import StepGraphError, collect_steps, flatten_steps, topological_order
from marin.execution.step_spec import StepSpec


@dataclass(slots=True)
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

    def outcome(self, kind: Outcome, *, error: str | None = None) -> StepOutcome:
        """This step's line in a run's report, for a step the run did not try (cached, not needed, ...)."""
        return StepOutcome(self.spec.name, self.spec.identity, self.output_path, kind, error=error)


@dataclass
class Plan:
    """The steps a run needs (``steps``, in topological order) and those it does not.

    ``not_needed`` are dependencies that only finished steps depend on: the run neither reads nor
    runs them, and their ``status`` is None (unread, not "missing").
    """

    steps: list[PlannedStep]
    not_needed: list[PlannedStep]


def plan_steps(
    steps: Iterable[Any],
    *,
    run_only: str | None,
    output_path_for: Callable[[StepSpec], str],
    existing_outputs: Mapping[str, str],
    read_every_step: bool = False,
) -> Plan:
    """What a run of ``steps`` needs, in topological order, with output paths and current status.

    ``existing_outputs`` maps identities to finished outputs elsewhere (see
    :class:`~marin.execution.step_runner.StepRunner`); every other step's output goes to
    ``output_path_for(spec)``. ``read_every_step`` reads and plans the dependencies of finished
    steps here too (a strict run checks the code behind every output); what only existing outputs
    elsewhere depend on is never needed.
    """
    roots = flatten_steps(steps, taker="StepRunner.run")
    specs, targets = _select(collect_steps(roots), roots, run_only)
    paths = [existing_outputs.get(spec.identity) or output_path_for(spec) for spec in specs]
    if len(set(paths)) < len(paths):  # rare: only then is it worth finding which two
        _refuse_shared_folders(specs, paths)
    # From the steps asked for down to their dependencies: a step is needed when something needed
    # and unfinished depends on it (nothing else ever reads its output in this run).
    needed = {spec.identity for spec in targets}
    planned: list[PlannedStep] = []
    not_needed: list[PlannedStep] = []
    for spec, output_path in zip(reversed(specs), reversed(paths)):
        if spec.identity not in needed:
            not_needed.append(PlannedStep(spec, output_path, None))
            continue
        status = read_status(output_path)
        check_recorded_identity(spec, output_path, status)
        existing = spec.identity in existing_outputs
        finished = status is not None and status.status == STATUS_SUCCESS
        if existing and not finished:
            raise RunOptionError(
                f"Step {spec.name!r} was given as finished at {output_path}, but its status there is "
                f"{status.status if status else 'missing'}; run it to completion there first."
            )
        if not finished or (read_every_step and not existing):
            needed.update(dep.identity for dep in spec.deps)
        planned.append(PlannedStep(spec, output_path, status))
    planned.reverse()
    not_needed.reverse()
    return Plan(planned, not_needed)


def _refuse_shared_folders(specs: list[StepSpec], paths: list[str]) -> None:
    """Raise :class:`StepGraphError` naming the first two steps whose output folders coincide."""
    owners: dict[str, StepSpec] = {}
    for spec, output_path in zip(specs, paths):
        other = owners.setdefault(output_path, spec)
        if other is not spec:
            raise StepGraphError(
                f"Steps {other.name!r} ({other.short_hash}) and {spec.name!r} ({spec.short_hash}) both write to "
                f"{output_path}; give one of them another output_path."
            )


def print_dry_run(plan: Plan, *, prefix: str, force_run_failed: bool, report: RunReport) -> None:
    """Print what a run would do with each step of ``plan``, and record it in ``report``."""
    planned = plan.steps
    print(f"Dry run under {prefix}: {len(planned) + len(plan.not_needed)} step(s)")
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
        _print_dry_run_line(item, outcome, report)
    for item in plan.not_needed:
        _print_dry_run_line(item, Outcome.NOT_NEEDED, report)
    counted = [(item, planned_flops(item.spec)) for item in planned]
    counted = [(item, flops) for item, flops in counted if flops is not None]
    if counted:
        to_run = sum(flops for item, flops in counted if not item.cached)
        print(f"Planned compute: {sum(flops for _, flops in counted):.3g} FLOPs over {len(counted)} step(s) that "
              f"declare it; {to_run:.3g} of it still to run.")
    print(f"Dry run: {report.summary()}; nothing was written.")


def _print_dry_run_line(item: PlannedStep, outcome: Outcome, report: RunReport) -> None:
    spec = item.spec
    flops = planned_flops(spec)
    compute = f"  {flops:9.2e} FLOPs{_size_and_data(spec)}" if flops is not None else ""
    print(f"  {_DRY_RUN_LABELS[outcome]:<18} {spec.short_hash}  {spec.name:<40} {item.output_path}{compute}{_mesh(spec)}")
    report.outcomes.append(item.outcome(outcome))


def _size_and_data(spec: StepSpec) -> str:
    """`` N 1.4e+05 D 7.2e+05`` for a sweep point that declares its parameters and tokens."""
    sweep = spec.annotations.get("sweep")
    if not isinstance(sweep, Mapping):
        return ""
    params, tokens = sweep.get("params"), sweep.get("tokens")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (params, tokens)):
        return ""
    return f"  N {params:.2g}  D {tokens:.2g}"


def _mesh(spec: StepSpec) -> str:
    """``  mesh data=2 x fsdp=256`` for a step that declares the device mesh it runs on (training
    steps do), naming the axes larger than one; -1 is an axis that takes the devices there are."""
    mesh = spec.annotations.get("mesh")
    if not isinstance(mesh, Mapping):
        return ""
    shown = [f"{axis}={size}" for axis, size in mesh.items() if size != 1]
    return "  mesh " + (" x ".join(shown) if shown else "1 device")


def planned_flops(spec: StepSpec) -> float | None:
    """The compute a step declares it will spend (its ``flops`` annotation: sweeps set it), or None."""
    flops = spec.annotations.get("flops")
    return float(flops) if isinstance(flops, (int, float)) and not isinstance(flops, bool) else None


_DRY_RUN_LABELS = {
    Outcome.CACHED: "cached",
    Outcome.WOULD_RUN: "to run",
    Outcome.FAILED: "failed (not rerun)",
    Outcome.DEP_FAILED: "dep failed",
    Outcome.NOT_NEEDED: "not needed",
}


def _select(specs: list[StepSpec], roots: list[StepSpec], run_only: str | None) -> tuple[list[StepSpec], list[StepSpec]]:
    """The steps a run considers and the ones it is asked for: all of ``specs`` and the ``roots``, or
    the steps whose name ``run_only`` matches with their dependencies, and those matched."""
    if not run_only:
        return specs, roots
    try:
        pattern = re.compile(run_only)
    except re.error as exc:
        raise RunOptionError(f"run_only {run_only!r} is not a valid regular expression: {exc}") from exc
    chosen = [s for s in specs if pattern.search(s.name)]
    if not chosen:
        names = ", ".join(s.name for s in specs)
        raise RunOptionError(f"run_only {run_only!r} matches no step. Step names: {names}.")
    # By identity: a dependency may be a different (but equal) object from the one kept in specs.
    considered = {s.identity for s in topological_order(chosen)}
    return [s for s in specs if s.identity in considered], chosen
