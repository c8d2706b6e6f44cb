"""The engine's command-line subcommands: ``marin run``, ``marin status``, ``marin explain``.

Each command module used by :mod:`marin.cli` exposes ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from iris.attempt_log import AttemptTally
from rigging.config.discovery import discover_config
from rigging.errors import ExplainedError
from rigging.log import get_logger

from marin.execution.records.catalog import StepListing, find_step_folders, list_steps
from marin.execution.records.executor_files import CorruptRecordError
from marin.execution.reproducibility.explain import identity_differences, identity_record_tree, identity_tree
from marin.execution.hashing.identity import InvalidStepError
from marin.execution.planning.run_defaults import ConfigError, RunOverrides
from marin.execution.running.script_launch import run_script
from marin.execution.planning.step_graph import StepGraphError
from marin.execution.step_runner import (
    CodeChangedError,
    OutputPathConflict,
    RunOptionError,
    StepRunFailed,
)

logger = get_logger(__name__)

EXIT_OK = 0
EXIT_STEP_FAILED = 1
EXIT_USAGE = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run",
        help="run a script that builds steps and calls StepRunner().run(...)",
        description="Run SCRIPT.py as __main__; its StepRunner().run(...) calls use the options given here "
        "(they take precedence over the script's own arguments).",
    )
    run.add_argument("script", help="path to a Python script")
    run.add_argument("--dry-run", action="store_true", default=None, help="print the plan (hash, output path, cached or to run); write nothing")
    run.add_argument("--prefix", help="where step outputs go: a folder or fsspec URL (default: MARIN_PREFIX, marin.yaml, ...)")
    run.add_argument("--run-only", metavar="REGEX", help="run only steps whose name matches REGEX (and their dependencies)")
    run.add_argument("--max-concurrent", type=int, metavar="N", help="run at most N steps at once")
    run.add_argument(
        "--force-run-failed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rerun steps that FAILED before (default: yes)",
    )
    run.add_argument(
        "--strict",
        action="store_true",
        default=None,
        help="refuse to reuse cached outputs made by other code than the step functions now (see marin status)",
    )
    run.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="override one field of the script's settings NAME (read with script_config); repeatable",
    )
    run.add_argument(
        "--config",
        dest="config_files",
        action="append",
        default=[],
        metavar="NAME=FILE.yaml",
        help="read the script's settings NAME from a YAML file, before any --set; repeatable",
    )
    run.add_argument("script_args", nargs="*", help="arguments for the script; put them after -- if they start with a dash")
    run.set_defaults(handler=run_command)

    status = subparsers.add_parser("status", help="list steps under a prefix with status, age and output path")
    status.add_argument("--prefix", help="folder or fsspec URL (default: the discovered prefix)")
    status.add_argument("--json", action="store_true", help="print the steps as one JSON list instead of a table")
    status.set_defaults(handler=status_command)

    explain = subparsers.add_parser(
        "explain",
        help="show the identity tree behind a step's hash; with two steps, what changed between them",
    )
    explain.add_argument("step", help="a step's output path, a path under the prefix, or a step name")
    explain.add_argument("other", nargs="?", help="a second step to compare against")
    explain.add_argument("--prefix", help="folder or fsspec URL (default: the discovered prefix)")
    explain.add_argument("--json", action="store_true", help="print the identity tree (or the differences) as JSON")
    explain.set_defaults(handler=explain_command)


def run_command(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.is_file():
        print(f"marin run: no such script {script}", file=sys.stderr)
        return EXIT_USAGE
    if args.max_concurrent is not None and args.max_concurrent < 1:
        print("marin run: --max-concurrent must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    script_args = [*(args.script_args or []), *getattr(args, "passthrough", [])]
    settings, config_files, problem = script_settings(args)
    if problem:
        print(f"marin run: {problem}", file=sys.stderr)
        return EXIT_USAGE
    prefix = discover_config(prefix=args.prefix).prefix if args.prefix else None
    # What the person at the terminal asked for; the script's runners take it (see run_defaults).
    overrides = RunOverrides(
        prefix=prefix,
        dry_run=args.dry_run,
        force_run_failed=args.force_run_failed,
        run_only=args.run_only,
        max_concurrent=args.max_concurrent,
        strict=args.strict,
        settings=settings,
        config_files=config_files,
    )
    try:
        launched = run_script(script, script_args, overrides)
    except StepRunFailed as exc:
        print(f"marin run: {exc}", file=sys.stderr)
        return EXIT_STEP_FAILED
    except (OutputPathConflict, StepGraphError, InvalidStepError, RunOptionError, CodeChangedError, ConfigError) as exc:
        print(f"marin run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ExplainedError as exc:
        # Refused on purpose while the script declared its steps (a sweep whose budget leaves two
        # sizes, a model config that cannot be): its message says what to change; no traceback.
        logger.debug("%s refused its declaration", script, exc_info=True)
        print(f"marin run: {script} was refused: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if launched.runs_started == 0:
        logger.warning("%s never called StepRunner().run(...); nothing was run.", script)
    unread = launched.unread_config_names()
    if unread:
        read = ", ".join(sorted(launched.configs_read)) or "none"
        print(
            f"marin run: settings were given for {', '.join(unread)}, which {script} never read "
            f"(it asked script_config for: {read}); those settings were not used.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return EXIT_OK


def script_settings(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], str | None]:
    """``--set`` and ``--config`` as RunOverrides holds them, or a message saying which one is malformed."""
    settings = tuple(getattr(args, "settings", None) or ())
    for setting in settings:
        key, sep, _ = setting.partition("=")
        name, dot, field_name = key.partition(".")
        if not (sep and dot and name.strip() and field_name.strip()):
            return (), (), f"--set {setting!r} is not of the form NAME.KEY=VALUE (e.g. --set train.num_train_steps=100)"
    files = []
    for entry in getattr(args, "config_files", None) or ():
        name, sep, path = entry.partition("=")
        if not (sep and name.strip() and path.strip()):
            return (), (), f"--config {entry!r} is not of the form NAME=FILE.yaml"
        files.append((name.strip(), path.strip()))
    return settings, tuple(files), None


def status_command(args: argparse.Namespace) -> int:
    prefix = discover_config(prefix=args.prefix).prefix
    listings = list_steps(prefix, with_attempts=True)
    if getattr(args, "json", False):
        print(json.dumps([_listing_record(listing) for listing in listings], indent=1))
        return EXIT_OK
    if not listings:
        print(f"No steps under {prefix}")
        return EXIT_OK
    width = max(len(listing.name) for listing in listings)
    print(f"{'STATUS':<11} {'AGE':>5}  {'STEP':<{width}}  OUTPUT PATH")
    for listing in listings:
        note = "  (code changed since this output was made)" if listing.code_changed else ""
        if listing.status == "RUNNING" and (listing.job or listing.attempt):
            where = f"iris job {listing.job}, " if listing.job else ""
            attempt = f"attempt {listing.attempt}" if listing.attempt else "no attempt started yet"
            note += f"  ({where}{attempt}: marin logs {listing.name} --follow)"
        if listing.attempts is not None and listing.attempts.eventful:
            note += f"  ({listing.attempts.describe()})"
        note += "".join(f"  ({problem})" for problem in listing.problems)
        print(f"{listing.status or '-':<11} {listing.age_text():>5}  {listing.name:<{width}}  {listing.output_path}{note}")
    changed = sum(1 for listing in listings if listing.code_changed)
    if changed:
        print(
            f"\n{changed} output(s) were made by code that has changed since (the function's source file now differs). "
            "They are still reused, as their identity is the same; bump the step's version to recompute, "
            "or `marin run --strict` to refuse them."
        )
    return EXIT_OK


def _listing_record(listing: StepListing) -> dict[str, Any]:
    """One step of ``marin status --json``: the table's columns, with times in seconds."""
    tally = listing.attempts or AttemptTally()
    return {
        "name": listing.name,
        "status": listing.status,
        "status_time": listing.status_time,
        "age_s": None if not listing.status_time else max(0.0, time.time() - listing.status_time),
        "identity": listing.identity,
        "output_path": listing.output_path,
        "code_changed": listing.code_changed,
        "attempt": listing.attempt,
        "job": listing.job,
        "attempts": tally.attempts,
        "preemptions": tally.preempted,
        "failed_attempts": tally.failed,
        "problems": list(listing.problems),
    }


def _resolve_one(prefix: str, what: str) -> list[str]:
    folders = find_step_folders(prefix, what)
    if not folders:
        print(f"marin explain: no step output found for {what!r} under {prefix}", file=sys.stderr)
    return folders


def explain_command(args: argparse.Namespace) -> int:
    try:
        return _explain(args)
    except CorruptRecordError as exc:
        print(f"marin explain: {exc} Run the step again to rewrite it (delete its folder first if it says SUCCESS).", file=sys.stderr)
        return EXIT_STEP_FAILED


def _explain(args: argparse.Namespace) -> int:
    prefix = discover_config(prefix=args.prefix).prefix
    first = _resolve_one(prefix, args.step)
    if not first:
        return EXIT_USAGE
    as_json = getattr(args, "json", False)
    if args.other is None:
        if as_json:
            print(json.dumps({**identity_record_tree(first[0]), "other_outputs": first[1:]}, indent=1))
            return EXIT_OK
        print("\n".join(identity_tree(first[0])))
        if len(first) > 1:
            print(f"\n{len(first)} outputs exist for {args.step!r} (newest shown); compare two with marin explain A B:")
            for folder in first:
                print(f"  {folder}")
        return EXIT_OK
    second = _resolve_one(prefix, args.other)
    if not second:
        return EXIT_USAGE
    path_a, path_b = first[0], second[0]
    if path_a == path_b and len(first) > 1:
        path_a, path_b = first[1], first[0]  # same name twice: compare the two newest runs
    differences = identity_differences(path_a, path_b)
    if as_json:
        print(json.dumps({"a": path_a, "b": path_b, "same_identity": not differences, "differences": differences}, indent=1))
        return EXIT_OK
    print(f"A: {path_a}\nB: {path_b}")
    if not differences:
        print("Same identity: nothing that is hashed differs.")
    else:
        print("What changed (A -> B):")
        for line in differences:
            print(f"  {line}")
    return EXIT_OK


__all__ = ["register", "run_command", "status_command", "explain_command"]
