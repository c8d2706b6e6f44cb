"""Run a DAG of steps once each, in dependency order, with bounded concurrency and caching.

``StepRunner().run(steps)``:

1. lowers lazy handles, collects every transitive dependency, refuses cycles, two different steps
   with one identity, and two identities sharing one output folder;
2. plans: a step whose ``.executor_status`` is SUCCESS *for its identity* is *cached* and skipped;
   a FAILED one is rerun when ``force_run_failed`` (the default) and otherwise reported failed. A
   folder whose records name another identity is never reused (see "Reuse" below);
3. runs the rest in topological order, at most ``max_concurrent`` at a time (default
   :data:`DEFAULT_MAX_CONCURRENT`; steps run in threads of this process), each under a lease so
   that two runners on one prefix never run a step twice;
4. marks every dependent of a failed step DEP_FAILED without running it; independent branches
   still finish;
5. returns a :class:`RunReport`, or raises :class:`StepRunFailed` (carrying the report) once all
   runnable work is done, if any step failed. ``raise_on_failure=False`` returns the report instead.

Step functions run where :mod:`marin.execution.step_executor` sends them: in the runner's threads
by default, or through a fray client (``StepRunner(client=RayClient())`` or ``MARIN_CLUSTER``) with
each step's ``resources``. The lease, status and artifact files are written by the runner the same
way on every backend.

Reuse. The status file records the full identity it is about. Before anything runs, every
planned folder's recorded identity is compared with the step's: a folder holding another
identity's output (an explicit ``output_path`` reused by a changed configuration, or two
configurations whose 8-digit folder hashes collide) is refused (:class:`OutputPathConflict`),
naming both identities; a SUCCESS whose identity no record confirms is refused too
(:class:`UnverifiedOutputError`). The comparison, not a longer folder hash, is what makes reuse
safe: a longer hash only makes a collision rarer, the comparison makes it harmless.

Drift. A step's function code is not part of its identity (see
:mod:`marin.execution.code_fingerprint`). A cached output made by other code is reused with a
warning, "code changed since this output was made"; with ``strict`` the run refuses it
(:class:`CodeChangedError`) before anything runs.
"""

from __future__ import annotations

import concurrent.futures as futures
import logging
import os
import re
import sysconfig
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fray.cluster import DistributedClient, current_client
from rigging import filesystem as fsx
from rigging.config.discovery import discover_config
from rigging.lease import DEFAULT_TTL_S, Lease
from rigging.log import get_logger, is_configured, setup_logging

from marin.execution import run_defaults, step_executor
from marin.execution.artifact import current_provenance, result_summary, save_artifact
from marin.execution.code_fingerprint import comparable
from marin.execution.executor_files import (
    INFO_FILE,
    LOCK_FILE,
    STATUS_DEP_FAILED,
    STATUS_FAILED,
    STATUS_FILE,
    STATUS_RUNNING,
    STATUS_SUCCESS,
    StatusRecord,
    read_status,
    recorded_identity,
    step_location,
    write_info,
    write_status,
)
from marin.execution.interrupts import Interrupt, RunInterrupts, RunInterruption
from marin.execution.lazy import LazyStep, StepGraphError, lower, topological_order
from marin.execution.step_context import LeaseLostError
from marin.execution.step_executor import InProcessStepExecutor, StepCall, StepExecutor, executor_for
from marin.execution.step_spec import StepSpec

logger = get_logger(__name__)

# Outcomes of one step in one run.
RAN = "ran"
CACHED = "cached"
FAILED = "failed"
DEP_FAILED = "dep_failed"
WOULD_RUN = "would_run"

# Used when max_concurrent is None: enough for wide DAGs of small steps, bounded so a 10,000-wide
# fan-out does not start 10,000 threads at once.
DEFAULT_MAX_CONCURRENT = 32


class OutputPathConflict(RuntimeError):
    """A step's output folder already holds the output of a step with another identity."""


class UnverifiedOutputError(OutputPathConflict):
    """A folder says SUCCESS but no record in it names the identity it is the output of."""


class CodeChangedError(RuntimeError):
    """Under ``strict``, cached outputs that were made by other code than the steps' functions now."""


class RunOptionError(ValueError):
    """An option of ``run`` that cannot be used (bad ``run_only`` pattern, ``max_concurrent`` < 1)."""


class PrefixNotWritableError(RunOptionError):
    """The output prefix is a local path where step outputs cannot be written."""


# Exceptions these packages define are raised on purpose, with a message that says what to do
# (a bad setting, a missing file); for them the traceback only buries the message.
_PROJECT_PACKAGES = frozenset({"rigging", "haliax", "fray", "iris", "zephyr", "levanter", "marin"})
_MESSAGE_ONLY_BASES = (ValueError, LookupError, OSError)


def _is_explained_error(exc: BaseException) -> bool:
    module = type(exc).__module__.split(".", 1)[0]
    return module in _PROJECT_PACKAGES and isinstance(exc, _MESSAGE_ONLY_BASES)


def _user_frame(exc: BaseException) -> str:
    """`` (in FUNC at FILE:LINE)`` for the deepest frame of the user's own code, or ``""``.

    A message-only error raised by a library call still points at the line that made the call.
    """
    found = ""
    tb = exc.__traceback__
    library_paths = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    while tb is not None:
        code = tb.tb_frame.f_code
        module = str(tb.tb_frame.f_globals.get("__name__", "")).split(".", 1)[0]
        if module not in _PROJECT_PACKAGES and not code.co_filename.startswith(library_paths) and code.co_filename != __file__:
            found = f" (in {code.co_name} at {code.co_filename}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found


# The runner's and the step executor's own frames sit above every step function's traceback.
_ENGINE_FILES = frozenset({__file__, step_executor.__file__})


def _step_traceback(exc: BaseException) -> str:
    """The traceback from the step function down, without the runner's own frames above it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in _ENGINE_FILES:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


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


def _remove_orphan_temporaries(output_path: str) -> int:
    """Delete the in-progress files of atomic writes that an earlier, dead attempt left behind.

    Called by the holder of the step's lease before the step function starts. The rule: at that
    moment every temporary file in the folder is an orphan, because the lease admits one attempt at
    a time and this attempt has written nothing yet (its own writers, zephyr shards included, start
    after this). Two kinds of temporaries are left alone: those of the lock file (this runner's
    heartbeat and competing runners' acquire attempts write them right now), and anything inside a
    subfolder that is another step's output folder (that step has its own lease and may be running).
    Deleting a temporary can never corrupt anything: at worst a writer that should not exist fails
    its final rename. One recursive listing and one batch delete keep it cheap on object stores.
    """
    files = fsx.find_files(output_path)
    control_files = (STATUS_FILE, INFO_FILE, LOCK_FILE)
    other_steps = tuple(
        folder + "/" for folder, _, name in (f.rpartition("/") for f in files) if folder and name in control_files
    )
    orphans = [
        f
        for f in files
        if fsx.is_temporary_name(f)
        and not f.rpartition("/")[2].startswith(f".{LOCK_FILE}.")
        and not f.startswith(other_steps)
    ]
    fsx.remove_files(output_path, orphans)
    return len(orphans)


_WAIT_POLL_S = 0.5


class StepRunFailed(RuntimeError):
    """At least one step failed; ``.report`` says which, and which dependents did not run."""

    def __init__(self, report: "RunReport") -> None:
        self.report = report
        lines = [f"{len(report.failed)} step(s) failed:"]
        for outcome in report.outcomes:
            if outcome.outcome == FAILED:
                lines.append(f"  {outcome.name} ({outcome.output_path}): {outcome.error}")
        if report.dep_failed:
            lines.append(f"Not run because a dependency failed: {', '.join(report.dep_failed)}")
        super().__init__("\n".join(lines))


@dataclass
class StepOutcome:
    name: str
    identity: str
    output_path: str
    outcome: str
    error: str | None = None
    seconds: float = 0.0
    result: Any = None


@dataclass
class RunReport:
    """What one ``run`` did, per step, in topological order."""

    outcomes: list[StepOutcome] = field(default_factory=list)
    dry_run: bool = False
    prefix: str = ""

    def _names(self, outcome: str) -> list[str]:
        return [o.name for o in self.outcomes if o.outcome == outcome]

    @property
    def ran(self) -> list[str]:
        return self._names(RAN)

    @property
    def cached(self) -> list[str]:
        return self._names(CACHED)

    @property
    def failed(self) -> list[str]:
        return self._names(FAILED)

    @property
    def dep_failed(self) -> list[str]:
        return self._names(DEP_FAILED)

    @property
    def would_run(self) -> list[str]:
        return self._names(WOULD_RUN)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.dep_failed

    def outcome_of(self, name: str) -> StepOutcome:
        for outcome in self.outcomes:
            if outcome.name == name:
                return outcome
        raise KeyError(f"No step named {name!r} in this run.")

    def summary(self) -> str:
        parts = [f"{len(self.ran)} ran", f"{len(self.cached)} cached", f"{len(self.failed)} failed", f"{len(self.dep_failed)} dep-failed"]
        if self.dry_run:
            parts = [f"{len(self.would_run)} to run", f"{len(self.cached)} cached", f"{len(self.failed)} failed"]
        return ", ".join(parts)


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
        if not self.cached:
            return False
        current = self.spec.code_fingerprint
        recorded = self.status.code if self.status else None
        return current is not None and comparable(recorded, current.digest) and recorded != current.digest


def _different_code(a: StepSpec, b: StepSpec) -> bool:
    code_a, code_b = a.code_fingerprint, b.code_fingerprint
    return code_a is not None and code_b is not None and code_a.digest != code_b.digest


def _where_defined(spec: StepSpec) -> str:
    code = spec.code_fingerprint
    if code is None or code.file is None:
        return spec.fn_description
    return f"{spec.fn_description} ({code.file}:{code.line})"


def _flatten(steps: Iterable[Any]) -> list[StepSpec | LazyStep]:
    """Accept specs, handles, and (nested) lists of them, e.g. ``run([lower(model)])``."""
    flat: list[StepSpec | LazyStep] = []
    stack = [iter([steps] if isinstance(steps, (StepSpec, LazyStep)) else steps)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, (StepSpec, LazyStep)):
            flat.append(item)
        elif isinstance(item, (list, tuple, set, frozenset)) or hasattr(item, "__next__"):
            stack.append(iter(item))
        else:
            raise TypeError(f"StepRunner.run takes StepSpecs and lazy handles (or lists of them), got {type(item).__name__}.")
    return flat


class StepRunner:
    """Runs steps under ``prefix`` (default: :func:`rigging.config.discovery.discover_config`).

    ``lease_ttl_s`` is how long a silent runner's lease survives before others take its steps
    over (a crashed runner on the same host is detected at once); ``poll_s`` is how often a
    runner waiting on another's step looks again. ``client`` is the fray client step functions run
    on (default: :func:`fray.cluster.current_client`: threads of this process unless configured
    otherwise, e.g. ``MARIN_CLUSTER=ray:auto``). ``strict`` refuses to reuse cached outputs made
    by other code than the steps' functions now (see :meth:`run`).
    """

    def __init__(
        self,
        prefix: str | None = None,
        *,
        lease_ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float | None = None,
        poll_s: float = 0.5,
        client: DistributedClient | None = None,
        strict: bool = False,
    ) -> None:
        override = run_defaults.current_overrides().prefix
        chosen = override or prefix
        config = discover_config(prefix=chosen)
        self.prefix = config.prefix
        self._prefix_source = config.source_of("prefix")
        self.lease_ttl_s = lease_ttl_s
        self.heartbeat_s = heartbeat_s
        self.poll_s = poll_s
        self.runner_id = uuid.uuid4().hex[:12]
        self._cancelled = RunInterruption()  # replaced by a fresh one per run
        # Where step functions run; None: fray's current client when a run starts (see step_executor).
        self.client = client
        self.strict = strict
        self._executor: StepExecutor = InProcessStepExecutor()

    # -- placement ----------------------------------------------------------------------------------

    def output_path_for(self, spec: StepSpec) -> str:
        """``<prefix>/<name>-<short hash>``, or the step's explicit ``output_path`` (relative ones under the prefix)."""
        if spec.output_path is None:
            return fsx.join(self.prefix, f"{spec.name}-{spec.short_hash}")
        if "://" in spec.output_path or spec.output_path.startswith("/"):
            return spec.output_path.rstrip("/")
        return fsx.join(self.prefix, spec.output_path.rstrip("/"))

    # -- graph ------------------------------------------------------------------------------------

    def _collect(self, steps: Iterable[Any]) -> list[StepSpec]:
        flat = _flatten(steps)
        handles = [s for s in flat if isinstance(s, LazyStep)]
        # Cycle check before lowering or hashing: an identity of a cyclic graph never finishes.
        topological_order(handles)
        by_handle = {spec.identity: spec for spec in lower(handles)} if handles else {}
        roots = [by_handle[s.identity] if isinstance(s, LazyStep) else s for s in flat]
        ordered = topological_order(roots)
        unique: dict[str, StepSpec] = {}
        result: list[StepSpec] = []
        for spec in ordered:
            seen = unique.get(spec.identity)
            if seen is None:
                unique[spec.identity] = spec
                result.append(spec)
            elif seen is not spec and (
                seen.fn_description != spec.fn_description
                or seen.output_path != spec.output_path
                or _different_code(seen, spec)
            ):
                raise StepGraphError(
                    f"Two different steps named {spec.name!r} share identity {spec.short_hash} "
                    f"(functions {_where_defined(seen)} and {_where_defined(spec)}, output paths {seen.output_path!r} "
                    f"and {spec.output_path!r}). Only one of them could run, and the other would silently get its "
                    "result: give one of them a different name, version or hash_attrs."
                )
        return result

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
        overrides = run_defaults.current_overrides()
        run_defaults.note_run_started()
        dry_run = bool(overrides.dry_run if overrides.dry_run is not None else (dry_run or False))
        force_run_failed = (
            overrides.force_run_failed if overrides.force_run_failed is not None else (True if force_run_failed is None else force_run_failed)
        )
        run_only = overrides.run_only if overrides.run_only is not None else run_only
        max_concurrent = overrides.max_concurrent if overrides.max_concurrent is not None else max_concurrent
        strict = bool(overrides.strict if overrides.strict is not None else (self.strict if strict is None else strict))
        if max_concurrent is not None and max_concurrent < 1:
            raise RunOptionError(f"max_concurrent must be at least 1 (or None for the default, {DEFAULT_MAX_CONCURRENT}), got {max_concurrent}.")
        _ensure_logging()
        self._check_prefix(writing=not dry_run)
        planned = self.plan(steps, run_only=run_only)
        logger.info(
            "Running %d step(s) under %s (%d already done)", len(planned), self.prefix, sum(p.cached for p in planned)
        )
        self._check_code(planned, strict=strict)
        report = RunReport(dry_run=dry_run, prefix=self.prefix)
        if dry_run:
            self._dry_run(planned, force_run_failed, report)
            return report
        self._execute(planned, force_run_failed, max_concurrent, report)
        logger.info("Run finished: %s", report.summary())
        self._print_final_summaries(planned)
        if raise_on_failure and not report.ok:
            raise StepRunFailed(report)
        return report

    def _check_code(self, planned: list[PlannedStep], *, strict: bool) -> None:
        """Say which cached outputs were made by other code; under ``strict``, refuse them."""
        changed = [item for item in planned if item.code_changed]
        for item in changed:
            log = logger.error if strict else logger.warning
            log(
                "Step %s: code changed since this output was made (%s is not the code that wrote %s). %s",
                item.spec.name,
                _where_defined(item.spec),
                item.output_path,
                "Refusing to reuse it (strict)." if strict else
                "Reusing it, because the identity is the same; bump the step's version to recompute, or use strict to refuse.",
            )
        if strict and changed:
            names = ", ".join(f"{item.spec.name} ({item.output_path})" for item in changed)
            raise CodeChangedError(
                f"Strict run: {len(changed)} cached output(s) were made by other code than their step functions now: "
                f"{names}. Give each changed step a new version= (its outputs are then recomputed), delete those "
                "folders, or run without strict to reuse them."
            )

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
                    fsx.check_conditional_writes(fsx.join(self.prefix, LOCK_FILE))
                except fsx.ConditionalWritesUnsupportedError as exc:
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

    def plan(self, steps: Iterable[Any], *, run_only: str | None = None) -> list[PlannedStep]:
        """The steps ``run`` would consider, in topological order, with output paths and current status.

        Reads one status file per step (plus ``.executor_info`` for explicit output paths) and
        writes nothing. Raises on cycles, identity clashes and output-path conflicts.
        """
        return self._plan(self._select(self._collect(steps), run_only))

    def _select(self, specs: list[StepSpec], run_only: str | None) -> list[StepSpec]:
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

    def _plan(self, specs: list[StepSpec]) -> list[PlannedStep]:
        planned = []
        owners: dict[str, StepSpec] = {}
        for spec in specs:
            output_path = self.output_path_for(spec)
            other = owners.setdefault(output_path, spec)
            if other is not spec:
                raise StepGraphError(
                    f"Steps {other.name!r} ({other.short_hash}) and {spec.name!r} ({spec.short_hash}) both write to "
                    f"{output_path}; give one of them another output_path."
                )
            status = read_status(output_path)
            self._check_recorded_identity(spec, output_path, status)
            planned.append(PlannedStep(spec, output_path, status))
        return planned

    def _check_recorded_identity(self, spec: StepSpec, output_path: str, status: StatusRecord | None) -> None:
        """Refuse a folder that holds another identity's output, or a SUCCESS no record ties to one."""
        recorded = recorded_identity(output_path, status)
        if recorded == spec.identity or (recorded is None and (status is None or status.status != STATUS_SUCCESS)):
            return
        if recorded is None:
            raise UnverifiedOutputError(
                f"Step {spec.name!r} ({spec.identity}): {output_path} says SUCCESS, but which configuration it is the "
                "output of cannot be confirmed: its .executor_status names no identity and its .executor_info is missing "
                "or unreadable. Refusing to reuse it. Delete that folder (e.g. `rm -r` it) to recompute it."
            )
        if spec.output_path is not None:
            why = "Its explicit output_path already holds the output of another configuration."
        else:
            why = (
                f"The two identities begin with the same {len(spec.short_hash)} hex digits, so their default folders "
                "collide (about one chance in four billion per pair); give this step a version= or an output_path."
            )
        raise OutputPathConflict(
            f"Step {spec.name!r} has identity {spec.short_hash} ({spec.identity}) but {output_path} holds the output of "
            f"identity {recorded[:8]} ({recorded}). {why} Refusing to reuse or overwrite it. Delete that folder to "
            "recompute there (e.g. `rm -r` it), or give the step another output_path; `marin explain` on the two "
            "shows what changed."
        )

    def _dry_run(self, planned: list[PlannedStep], force_run_failed: bool, report: RunReport) -> None:
        print(f"Dry run under {self.prefix}: {len(planned)} step(s)")
        blocked: set[str] = set()
        for item in planned:
            spec, status = item.spec, item.status
            if status is not None and status.status == STATUS_SUCCESS:
                outcome = CACHED
            elif any(dep.identity in blocked for dep in spec.deps):
                outcome = DEP_FAILED
            elif status is not None and status.status == STATUS_FAILED and not force_run_failed:
                outcome = FAILED
            else:
                outcome = WOULD_RUN
            if outcome in (FAILED, DEP_FAILED):
                blocked.add(spec.identity)
            label = {CACHED: "cached", WOULD_RUN: "to run", FAILED: "failed (not rerun)", DEP_FAILED: "dep failed"}[outcome]
            print(f"  {label:<18} {spec.short_hash}  {spec.name:<40} {item.output_path}")
            report.outcomes.append(StepOutcome(spec.name, spec.identity, item.output_path, outcome))
        print(f"Dry run: {report.summary()}; nothing was written.")

    def _execute(self, planned: list[PlannedStep], force_run_failed: bool, max_concurrent: int | None, report: RunReport) -> None:
        outcomes: dict[str, StepOutcome] = {}
        paths = {item.spec.identity: item.output_path for item in planned}
        pending: list[PlannedStep] = []
        self._run_started_at = time.time()
        self._executor = executor_for(self.client if self.client is not None else current_client())
        for item in planned:
            spec, status = item.spec, item.status
            if status is not None and status.status == STATUS_SUCCESS:
                outcomes[spec.identity] = StepOutcome(spec.name, spec.identity, item.output_path, CACHED)
                logger.info("Step %s cached: %s", spec.name, item.output_path)
            elif status is not None and status.status == STATUS_FAILED and not force_run_failed:
                error = f"failed in an earlier run ({status.error}); not rerun because force_run_failed is off"
                outcomes[spec.identity] = StepOutcome(spec.name, spec.identity, item.output_path, FAILED, error=error)
                logger.error("Step %s %s: %s", spec.name, error, item.output_path)
            else:
                pending.append(item)

        total_to_run = len(pending)
        workers = max_concurrent or DEFAULT_MAX_CONCURRENT
        running: dict[futures.Future, PlannedStep] = {}
        # Fresh per run: it records which signal (Ctrl-C or SIGTERM) stopped this run, and a step
        # still finishing from an earlier run keeps its own.
        self._cancelled = RunInterruption()
        with futures.ThreadPoolExecutor(max_workers=max(1, min(workers, max(1, total_to_run))), thread_name_prefix="marin-step") as pool:
            with RunInterrupts(self._cancelled, running) as interrupts:
                try:
                    self._schedule(pool, pending, running, outcomes, paths, workers, total_to_run)
                except KeyboardInterrupt:  # raised where no handler could be installed (not the main thread)
                    interrupts.stop_steps(Interrupt.CTRL_C)
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
        interrupts.raise_if_interrupted()
        report.outcomes.extend(outcomes[item.spec.identity] for item in planned if item.spec.identity in outcomes)

    def _schedule(
        self,
        pool: futures.ThreadPoolExecutor,
        pending: list[PlannedStep],
        running: dict[futures.Future, PlannedStep],
        outcomes: dict[str, StepOutcome],
        paths: dict[str, str],
        workers: int,
        total_to_run: int,
    ) -> None:
        """Submit steps as their dependencies finish; mark dependents of failures DEP_FAILED."""
        finished = 0
        run_seconds = 0.0
        while pending or running:
            if self._cancelled.is_set():
                # Interrupted: start nothing new, but collect the outcomes of the steps still stopping.
                if pending:
                    logger.warning("Interrupted: %d step(s) not started: %s", len(pending), ", ".join(i.spec.name for i in pending))
                    pending.clear()
                if not running:
                    break
            progressed = False
            for item in list(pending):
                dep_states = [outcomes.get(dep.identity) for dep in item.spec.deps]
                if any(o is not None and o.outcome in (FAILED, DEP_FAILED) for o in dep_states):
                    pending.remove(item)
                    outcomes[item.spec.identity] = self._mark_dep_failed(item, dep_states)
                    progressed = True
                    continue
                if len(running) >= workers:
                    continue
                if all(o is not None and o.outcome in (RAN, CACHED) for o in dep_states):
                    pending.remove(item)
                    dep_paths = {dep.identity: paths[dep.identity] for dep in item.spec.deps}
                    running[pool.submit(self._run_one, item, dep_paths)] = item
                    progressed = True
            if progressed:
                continue  # a newly blocked step may unblock (or block) others in this same pass
            if not running:
                break  # nothing can make progress (should not happen with a valid plan)
            # A timeout keeps the loop noticing an interrupt while long steps run.
            done, _ = futures.wait(list(running), timeout=_WAIT_POLL_S, return_when=futures.FIRST_COMPLETED)
            for future in done:
                item = running.pop(future)
                outcome = future.result()
                outcomes[item.spec.identity] = outcome
                finished += 1
                run_seconds += outcome.seconds
                self._log_progress(outcome, finished, total_to_run, run_seconds, workers)

    def _log_progress(self, outcome: StepOutcome, finished: int, total: int, run_seconds: float, workers: int) -> None:
        remaining = total - finished
        eta = run_seconds / finished * remaining / max(1, min(workers, remaining or 1))
        verb = {RAN: "finished", CACHED: "was completed by another runner", FAILED: "FAILED"}.get(outcome.outcome, outcome.outcome)
        message = f"Step %s {verb} in %.1fs: %s [%d/%d run, ETA %.0fs]"
        level = logger.error if outcome.outcome == FAILED else logger.info
        level(message, outcome.name, outcome.seconds, outcome.output_path, finished, total, eta)

    def _mark_dep_failed(self, item: PlannedStep, dep_states: list[StepOutcome | None]) -> StepOutcome:
        spec = item.spec
        culprits = [o.name for o in dep_states if o is not None and o.outcome in (FAILED, DEP_FAILED)]
        error = f"dependency failed: {', '.join(culprits)}"
        logger.warning("Step %s not run (%s): %s", spec.name, error, item.output_path)
        # Record it on disk only if no other runner is working on the step right now.
        lease = self._lease(item)
        if lease.try_acquire():
            try:
                current = read_status(item.output_path)
                if current is None or current.status != STATUS_SUCCESS:
                    write_info(item.output_path, self._info(item, {}))
                    self._write_status(item, STATUS_DEP_FAILED, error=error)
            finally:
                lease.release()
        return StepOutcome(spec.name, spec.identity, item.output_path, DEP_FAILED, error=error)

    def _lease(self, item: PlannedStep) -> Lease:
        return Lease(
            fsx.join(item.output_path, LOCK_FILE),
            holder_id=f"{self.runner_id}-{item.spec.short_hash}",
            ttl_s=self.lease_ttl_s,
            heartbeat_s=self.heartbeat_s,
        )

    def _write_status(self, item: PlannedStep, status: str, *, error: str | None = None) -> StatusRecord:
        code = item.spec.code_fingerprint
        return write_status(
            item.output_path,
            status,
            holder=self.runner_id,
            error=error,
            identity=item.spec.identity,
            code=code.digest if code else None,
        )

    def _info(self, item: PlannedStep, dep_paths: dict[str, str]) -> dict[str, Any]:
        spec = item.spec
        code = spec.code_fingerprint
        provenance = current_provenance()
        return {
            "name": spec.name,
            "identity": spec.identity,
            "short_hash": spec.short_hash,
            "version": spec.version,
            "hash_attrs": spec.identity_record["hash_attrs"],
            "fn": spec.fn_description,
            "code": code.to_json() if code else None,
            "git": {"commit": provenance.git_commit, "dirty": provenance.git_dirty},
            "deps": [
                {
                    "name": dep.name,
                    "identity": dep.identity,
                    "output_path": dep_paths.get(dep.identity),
                    # Where it lies inside the prefix: what survives moving or copying the prefix.
                    "location": step_location(dep_paths[dep.identity], self.prefix) if dep.identity in dep_paths else None,
                }
                for dep in spec.deps
            ],
            "output_path": item.output_path,
            "location": step_location(item.output_path, self.prefix),
            "explicit_output_path": spec.output_path is not None,
            "resources": repr(spec.resources) if spec.resources is not None else None,
            "identity_record": spec.identity_record,
        }

    def _run_one(self, item: PlannedStep, dep_paths: dict[str, str]) -> StepOutcome:
        spec, output_path = item.spec, item.output_path
        started = time.monotonic()

        def outcome(kind: str, error: str | None = None, result: Any = None) -> StepOutcome:
            return StepOutcome(spec.name, spec.identity, output_path, kind, error, time.monotonic() - started, result)

        try:
            fsx.makedirs(output_path)
            lease = self._lease(item)
            waiting_logged = False
            while not lease.try_acquire():
                if self._cancelled.is_set():
                    return outcome(FAILED, "interrupted while waiting for another runner")
                status = read_status(output_path)
                if status is not None and status.status == STATUS_SUCCESS and status.identity == spec.identity:
                    return outcome(CACHED)
                if not waiting_logged:
                    holder = lease.read()
                    logger.info(
                        "Step %s is being run by another runner (%s); waiting: %s",
                        spec.name,
                        f"{holder.host} pid {holder.pid}" if holder else "?",
                        output_path,
                    )
                    waiting_logged = True
                time.sleep(self.poll_s)
        except Exception as exc:
            logger.exception("Step %s could not start: %s", spec.name, output_path)
            return outcome(FAILED, f"{type(exc).__name__}: {exc}")

        try:
            status = read_status(output_path)
            try:
                # Planned before the lease was ours: what another runner wrote since is checked again.
                self._check_recorded_identity(spec, output_path, status)
            except OutputPathConflict as exc:
                logger.error("Step %s not run: %s", spec.name, exc)
                return outcome(FAILED, str(exc))  # the folder is another step's: write nothing there
            if status is not None and status.status == STATUS_SUCCESS:
                return outcome(CACHED)
            if (
                status is not None
                and status.status == STATUS_FAILED
                and status.time >= self._run_started_at
                and status.holder != self.runner_id
            ):
                # Another runner tried it while we waited; running it again now would double the work.
                return outcome(FAILED, f"failed in another runner during this run: {status.error}")
            try:
                removed = _remove_orphan_temporaries(output_path)
                if removed:
                    logger.info(
                        "Step %s: removed %d temporary file(s) a killed earlier attempt left in %s",
                        spec.name, removed, output_path,
                    )
            except Exception as exc:  # housekeeping: never a reason to fail the step
                logger.warning("Step %s: could not clean up temporary files in %s: %s", spec.name, output_path, exc)
            logger.info("Step %s started: %s", spec.name, output_path)
            write_info(output_path, self._info(item, dep_paths))
            self._write_status(item, STATUS_RUNNING)
            result = self._executor.run(StepCall(spec, output_path, dep_paths, lease.lost_event, self._cancelled))
            lease.check()
            save_artifact(output_path, result, step=spec.name, identity=spec.identity, prefix=self.prefix)
            # Confirm with the lock file itself, not only the heartbeat thread's last look.
            lease.heartbeat()
            lease.check()
            # SUCCESS goes last: a reader who sees it can trust the output and artifact are complete.
            self._write_status(item, STATUS_SUCCESS)
            return outcome(RAN, result=result)
        except BaseException as exc:  # noqa: BLE001 - a step's failure must never take the runner down
            message = f"{type(exc).__name__}: {exc}"
            if lease.lost:
                message = f"lost the lease (another runner took the step over); {message}"
            else:
                try:
                    self._write_status(item, STATUS_FAILED, error=message)
                except Exception:
                    logger.exception("Could not record FAILED for %s", output_path)
            if _is_explained_error(exc) or lease.lost or self._cancelled.is_set():
                # The message says what to do (or the run's own stop request is the cause); the
                # traceback is there for whoever wants it.
                logger.error("Step %s failed (output folder %s): %s%s", spec.name, output_path, message, _user_frame(exc))
                logger.debug("Traceback of step %s:\n%s", spec.name, _step_traceback(exc))
            else:
                logger.error("Step %s failed (output folder %s):\n%s", spec.name, output_path, _step_traceback(exc).rstrip())
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return outcome(FAILED, message)
        finally:
            lease.release()


__all__ = [
    "CodeChangedError",
    "OutputPathConflict",
    "PlannedStep",
    "PrefixNotWritableError",
    "RunOptionError",
    "RunReport",
    "StepGraphError",
    "StepOutcome",
    "StepRunFailed",
    "StepRunner",
    "LeaseLostError",
    "UnverifiedOutputError",
]
