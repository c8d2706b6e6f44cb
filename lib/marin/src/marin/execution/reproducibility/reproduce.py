"""Rerun a finished step from its recorded identity, in a scratch prefix, and compare the outputs.

``reproduce(request)``:

1. runs the script as ``marin run`` does (:func:`~marin.execution.running.script_launch.run_script`, with
   the same prefix and settings), except that its runners hand over their steps instead of
   running them; so the step, and the prefix its output lies under, are exactly what a run of the
   script would use;
2. finds the step by name, folder or output path, and refuses, naming both sides, when its folder
   there is not a finished output of the identity the script declares now (the script, its
   settings or its inputs changed since), or was made by other code than the step's function now
   (unless ``changed_code``: then the rerun shows what the new code changes), or holds a file that
   is not what the step recorded when it committed it (:mod:`zephyr.output_checksums`);
3. reads each dependency where the step's ``.executor_info`` says it was read, after checking it
   is finished for the identity the script declares;
4. runs the step alone with a :class:`~marin.execution.step_runner.StepRunner` on the scratch
   prefix, its dependencies given as ``existing_outputs`` (read there, never run or written);
5. compares the two folders (:mod:`~marin.execution.reproducibility.output_comparison`) and removes the scratch
   output when they are identical, unless asked to keep it; a difference keeps it for inspection.

Nothing under the original prefix is written: a scratch prefix inside it, or holding it, is refused,
symbolic links followed. The scratch prefix defaults to a new local temporary
folder; a step that runs on a cluster needs one its workers reach (``scratch=`` any URL).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from levanter.errors import LevanterError
from rigging import filesystem as fsx
from rigging.log import get_logger
from zephyr.output_checksums import changed_files

from marin.errors import MarinError
from marin.execution.records.catalog import find_step_folders
from marin.execution.hashing.code_fingerprint import comparable
from marin.execution.records.executor_files import STATUS_SUCCESS, read_info, read_status, recorded_dependency_paths
from marin.execution.reproducibility.output_comparison import OutputComparison, Placement, compare_outputs
from marin.execution.planning.output_reuse import OutputPathConflict, check_recorded_identity
from marin.execution.planning.run_defaults import RunOverrides
from marin.execution.running.script_launch import declared_steps, prefix_in_environment
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

logger = get_logger(__name__)


class ReproduceError(MarinError, ValueError):
    """A step that cannot be reproduced as asked: unknown, unfinished, or not what the script declares now."""


class RerunFailed(MarinError, RuntimeError):
    """The rerun of the step failed, or its output could not be compared; its folder in the scratch prefix is kept."""


@dataclass(frozen=True)
class ReproduceRequest:
    """``step``: a step name, its folder (``name-hash``, relative to the prefix) or its output path.
    ``prefix``, ``settings`` and ``config_files`` are those of ``marin run``."""

    script: Path
    step: str
    script_args: tuple[str, ...] = ()
    prefix: str | None = None
    scratch: str | None = None
    settings: tuple[str, ...] = ()
    config_files: tuple[tuple[str, str], ...] = ()
    keep: bool = False
    changed_code: bool = False
    all_differences: bool = False


@dataclass(frozen=True)
class Reproduction:
    step: StepSpec
    original: str  # the step's output folder under the original prefix
    rerun: str  # its rerun's folder under the scratch prefix
    inputs: dict[str, str]  # dependency name -> the folder it was read from
    comparison: OutputComparison
    kept: bool  # whether the rerun's folder is still there


def reproduce(request: ReproduceRequest) -> Reproduction:
    """Rerun ``request.step`` in a scratch prefix and compare (see the module docstring)."""
    runner, spec = _find_step(request)
    original = runner.output_path_for(spec)
    _check_original(request, runner, spec, original)
    inputs = _inputs(spec, original, runner)
    scratch, made_scratch = _scratch(request, runner.prefix)
    _check_unchanged(spec, original)
    # An absolute output_path is placement, not identity: the rerun goes to the step's usual folder.
    target = dataclasses.replace(spec, output_path=None) if _is_absolute(spec.output_path) else spec
    rerun_runner = StepRunner(prefix=scratch, client=runner.client, existing_outputs=inputs, overrides=RunOverrides())
    rerun = rerun_runner.output_path_for(target)
    if fsx.find_files(rerun):
        raise ReproduceError(f"{rerun} already holds files; give a scratch prefix where step {spec.name!r} has no output yet.")
    names = {dep.identity: dep.name for dep in spec.deps}
    logger.info("Reproducing %s (%s) from %s in %s", spec.name, spec.short_hash, original, rerun)
    with prefix_in_environment(scratch):  # for anything in the step that reads the prefix itself
        report = rerun_runner.run([target], raise_on_failure=False)
    outcome = report.outcome_of(spec.name)
    if not outcome.outcome.succeeded:
        raise RerunFailed(f"The rerun of {spec.name!r} failed ({outcome.error}); its folder is kept: {rerun}")
    placement = Placement(original, rerun, runner.prefix, scratch)
    try:
        comparison = compare_outputs(placement, stop_at_first=not request.all_differences)
    except LevanterError as exc:  # a checkpoint that cannot be read
        raise RerunFailed(f"Could not compare {original} with its rerun: {exc} The rerun is kept: {rerun}") from exc
    kept = request.keep or not comparison.identical
    if not kept:
        fsx.rm(scratch if made_scratch else rerun, recursive=True)
    return Reproduction(spec, original, rerun, {names[i]: path for i, path in inputs.items()}, comparison, kept)


def _is_absolute(path: str | None) -> bool:
    return path is not None and ("://" in path or path.startswith("/"))


# -- which step ------------------------------------------------------------------------------------


def _declared_steps(request: ReproduceRequest) -> list[tuple[StepRunner, StepSpec]]:
    overrides = RunOverrides(prefix=request.prefix, settings=request.settings, config_files=request.config_files)
    declared, launched = declared_steps(request.script, request.script_args, overrides)
    if launched.runs_started == 0:
        raise ReproduceError(f"{request.script} never called StepRunner().run(...), so it declares no step to reproduce.")
    unread = launched.unread_config_names()
    if unread:
        raise ReproduceError(f"settings were given for {', '.join(unread)}, which {request.script} never read.")
    return declared


def _find_step(request: ReproduceRequest) -> tuple[StepRunner, StepSpec]:
    declared = _declared_steps(request)
    what = request.step.rstrip("/")
    matches = [(runner, spec) for runner, spec in declared if _names(runner, spec, what)]
    if len({spec.identity for _, spec in matches}) > 1:
        folders = ", ".join(runner.output_path_for(spec) for runner, spec in matches)
        raise ReproduceError(f"{request.script} declares {len(matches)} steps named {what!r} ({folders}); name one by its folder.")
    if matches:
        return matches[0]
    _refuse_changed_folder(declared, what)
    names = ", ".join(sorted({spec.name for _, spec in declared}))
    raise ReproduceError(f"{request.script} declares no step {what!r}; its steps are: {names}.")


def _names(runner: StepRunner, spec: StepSpec, what: str) -> bool:
    """Whether ``what`` names ``spec``: its name, its folder under the prefix, or its output path."""
    output = runner.output_path_for(spec)
    return what in (spec.name, output) or (not _is_absolute(what) and fsx.join(runner.prefix, what) == output)


def _refuse_changed_folder(declared: Sequence[tuple[StepRunner, StepSpec]], what: str) -> None:
    """``what`` is an existing step folder that no declared step has: say what the script declares now."""
    for runner in {id(r): r for r, _ in declared}.values():
        folder = what if _is_absolute(what) else fsx.join(runner.prefix, what)
        info = read_info(folder)
        if not info:
            continue
        same_name = [spec for r, spec in declared if r is runner and spec.name == info.get("name")]
        if same_name:
            now = same_name[0]
            raise ReproduceError(
                f"{folder} holds step {now.name!r} with identity {str(info.get('identity'))[:8]}, but the script now "
                f"declares it with identity {now.short_hash}: the script, its settings or its inputs changed since "
                f"that output was made (`marin explain {folder} {runner.output_path_for(now)}` shows what). Reproduce "
                "it with the script and settings that made it."
            )


# -- what the rerun reads ----------------------------------------------------------------------------


def _check_original(request: ReproduceRequest, runner: StepRunner, spec: StepSpec, original: str) -> None:
    status = read_status(original)
    if status is None:
        others = [f for f in find_step_folders(runner.prefix, spec.name) if f != original]
        if others:
            raise ReproduceError(
                f"The script declares step {spec.name!r} with identity {spec.short_hash}, which has no output under "
                f"{runner.prefix}; {others[0]} holds another identity of it: the script, its settings or its inputs "
                f"changed since that output was made (`marin explain {others[0]}` shows what was hashed)."
            )
        raise ReproduceError(f"Step {spec.name!r} has no output at {original}: run it first (marin run {request.script}).")
    try:
        check_recorded_identity(spec, original, status)
    except OutputPathConflict as exc:
        raise ReproduceError(str(exc)) from None
    if status.status != STATUS_SUCCESS:
        raise ReproduceError(f"Step {spec.name!r} is {status.status} at {original}; only a finished step can be reproduced.")
    code = spec.code_fingerprint
    if code is not None and comparable(status.code, code.digest) and status.code != code.digest and not request.changed_code:
        commit = ((read_info(original) or {}).get("git") or {}).get("commit")
        made_at = f" at commit {commit[:12]}" if commit else ""
        raise ReproduceError(
            f"Step {spec.name!r}: {spec.defined_at} is not the code that made {original}{made_at} (its code changed "
            "since), so a rerun would test the new code, not reproduce the output. Check out the code that made it, "
            "or pass --changed-code to see what the new code changes."
        )


def _check_unchanged(spec: StepSpec, original: str) -> None:
    """Refuse an original whose files are not what the step recorded when it committed them: a
    comparison would blame the rerun for a change made since. (A step committed before checksums
    were recorded is compared as it is.)"""
    changed = [str(error) for error in changed_files(original) or []] + _self_checked_problems(original)
    if changed:
        more = f" ({len(changed) - 1} more files changed too)" if len(changed) > 1 else ""
        raise ReproduceError(f"Step {spec.name!r} cannot be reproduced: {changed[0]}{more}.")


def _self_checked_problems(original: str) -> list[str]:
    """What the output's token caches and checkpoints, which carry checksums of their own (and are
    left out of the step's manifest), say of their files: each checked by its own reader."""
    from levanter.trainer.checkpoint_manifest import MANIFEST_NAME as CHECKPOINT_MANIFEST
    from levanter.trainer.checkpoint_manifest import verify_manifest
    from levanter.trainer.checkpoint_staging import COMMIT_MARKER
    from zephyr.token_cache.errors import CorruptTokenCacheError
    from zephyr.token_cache.layout import LEDGER_NAME
    from zephyr.token_cache.reader import TokenCache

    problems: list[str] = []
    for name in sorted(fsx.find_files(original)):
        if any(part.startswith(".") for part in name.split("/")):
            continue
        folder, base = posixpath.split(name)
        if base == LEDGER_NAME:
            try:
                TokenCache.open(fsx.join(original, folder))  # checks every file against the cache's checksums
            except CorruptTokenCacheError as exc:
                problems.append(f"{exc}; the output was changed after the step finished")
        elif base == CHECKPOINT_MANIFEST:
            step = fsx.join(original, folder)
            problems.extend(f"{fsx.join(step, problem)}; the output was changed after the step finished"
                            for problem in verify_manifest(step, exclude=(COMMIT_MARKER,)).problems)
    return problems


def _inputs(spec: StepSpec, original: str, runner: StepRunner) -> dict[str, str]:
    """Each dependency's identity -> the finished folder the step read it from (recorded, else where the
    script's runner puts it)."""
    recorded = {dep.get("identity"): path for dep, path in recorded_dependency_paths(original, read_info(original, strict=True))}
    inputs = {}
    for dep in spec.deps:
        path = recorded.get(dep.identity) or runner.output_path_for(dep)
        status = read_status(path)
        if status is None or status.status != STATUS_SUCCESS or status.identity not in (None, dep.identity):
            state = status.status if status else "no output"
            raise ReproduceError(
                f"Input {dep.name!r} of step {spec.name!r} is not a finished output of identity {dep.short_hash} at "
                f"{path} ({state}); it was moved or deleted since. Run the script to remake it first."
            )
        inputs[dep.identity] = path
    return inputs


def _scratch(request: ReproduceRequest, original_prefix: str) -> tuple[str, bool]:
    """The scratch prefix, and whether it was made here (then it is removed whole afterwards)."""
    if request.scratch is None:
        return tempfile.mkdtemp(prefix="marin-reproduce-"), True
    scratch = fsx.absolute(request.scratch).rstrip("/")
    # Compared where they really lie: a symbolic link (either side, or a folder above) may lead one into the other.
    where_scratch, where_root = _resolved(scratch), _resolved(original_prefix)
    if where_scratch == where_root or where_scratch.startswith(where_root + "/") or where_root.startswith(where_scratch + "/"):
        shown = scratch if where_scratch == scratch else f"{scratch} (that is, {where_scratch})"
        raise ReproduceError(
            f"The scratch prefix {shown} overlaps the original prefix {where_root}; the rerun must not touch the "
            "original. Choose a folder outside it."
        )
    return scratch, False


def _resolved(url: str) -> str:
    """A local path with every symbolic link followed (the part that exists); any other URL as given."""
    url = fsx.absolute(url).rstrip("/")
    return os.path.realpath(url) if fsx.is_local(url) else url


def describe(reproduction: Reproduction) -> list[str]:
    """The report printed by ``marin reproduce``: the verdict first."""
    comparison = reproduction.comparison
    arrays = f", {comparison.arrays:,} arrays" if comparison.arrays else ""
    left_out = f"; left out: {', '.join(_grouped(comparison.left_out))}" if comparison.left_out else ""
    lines: list[str] = []
    if comparison.identical:
        files = f"{comparison.files:,} file{'s' if comparison.files != 1 else ''}"
        lines.append(f"bit-identical: {reproduction.step.name} ({files}{arrays} compared{left_out})")
    else:
        first = comparison.differences[0]
        lines.append(f"different: {reproduction.step.name}: first difference in {first.path}: {first.what}")
        lines.extend(f"  also differs: {d.path}: {d.what}" for d in comparison.differences[1:])
    if comparison.unpaired_checkpoints:
        unpaired = ", ".join(comparison.unpaired_checkpoints)
        lines.append(f"  checkpoints in one run only (saved by the clock or at an interruption), not compared: {unpaired}")
    lines.append(f"  original: {reproduction.original}")
    lines.append(f"  rerun:    {reproduction.rerun}{' (kept)' if reproduction.kept else ' (removed)'}")
    for name, path in reproduction.inputs.items():
        lines.append(f"  input:    {name}: {path} (read only)")
    return lines


def _grouped(paths: list[str]) -> list[str]:
    """Paths, those inside a folder written as ``FOLDER/ (N files)`` (attempt logs can be many)."""
    folders: dict[str, int] = {}
    for path in paths:
        top = path.split("/", 1)[0] + "/" if "/" in path else path
        folders[top] = folders.get(top, 0) + 1
    return [f"{top} ({count} files)" if top.endswith("/") else top for top, count in folders.items()]


__all__ = ["ReproduceError", "ReproduceRequest", "Reproduction", "RerunFailed", "describe", "reproduce"]
