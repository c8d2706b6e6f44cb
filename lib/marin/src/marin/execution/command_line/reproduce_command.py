"""``marin reproduce SCRIPT.py STEP``: rerun a finished step in a scratch prefix and compare outputs.

Exit status: 0 when the rerun's output is identical to the original's, 1 when it differs (or the
rerun failed), 2 when the step cannot be reproduced as asked (unknown, unfinished, changed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rigging.config.discovery import discover_config

from marin.execution.command_line.commands import script_settings
from marin.execution.records.executor_files import CorruptRecordError
from marin.execution.hashing.identity import InvalidStepError
from marin.execution.reproducibility.reproduce import ReproduceError, ReproduceRequest, RerunFailed, describe, reproduce
from marin.execution.planning.run_defaults import ConfigError, RunOptionError
from marin.execution.planning.step_graph import StepGraphError

EXIT_IDENTICAL = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reproduce",
        help="rerun a finished step in a scratch prefix and say whether its output is bit-identical",
        description="Run SCRIPT.py as `marin run` would to learn its steps, rerun STEP alone in a scratch prefix "
        "(its inputs read from the original prefix, which is never written), and compare the two outputs file by "
        "file. Exit 0: bit-identical; 1: different (the first difference is printed); 2: cannot reproduce.",
    )
    parser.add_argument("script", help="the script that declared the step (as given to marin run)")
    parser.add_argument("step", help="the step's name, its folder (name-hash) under the prefix, or its output path")
    parser.add_argument("--prefix", help="where the original outputs are (default: as marin run finds it)")
    parser.add_argument("--scratch", help="prefix for the rerun (default: a new local temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the rerun's output even when it is identical")
    parser.add_argument("--all", dest="all_differences", action="store_true", help="list every differing file, not only the first")
    parser.add_argument(
        "--changed-code",
        action="store_true",
        help="rerun even if the step's function changed since the output was made (shows what the change alters)",
    )
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME.KEY=VALUE", help="as for marin run")
    parser.add_argument("--config", dest="config_files", action="append", default=[], metavar="NAME=FILE.yaml", help="as for marin run")
    parser.add_argument("script_args", nargs="*", help="arguments for the script; put them after -- if they start with a dash")
    parser.set_defaults(handler=reproduce_command)


def reproduce_command(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.is_file():
        print(f"marin reproduce: no such script {script}", file=sys.stderr)
        return EXIT_USAGE
    settings, config_files, problem = script_settings(args)
    if problem:
        print(f"marin reproduce: {problem}", file=sys.stderr)
        return EXIT_USAGE
    request = ReproduceRequest(
        script=script,
        step=args.step,
        script_args=(*args.script_args, *getattr(args, "passthrough", [])),
        prefix=discover_config(prefix=args.prefix).prefix if args.prefix else None,
        scratch=args.scratch,
        settings=settings,
        config_files=config_files,
        keep=args.keep,
        changed_code=args.changed_code,
        all_differences=args.all_differences,
    )
    try:
        reproduction = reproduce(request)
    except RerunFailed as exc:
        print(f"marin reproduce: {exc}", file=sys.stderr)
        return EXIT_DIFFERENT
    except (ReproduceError, ConfigError, RunOptionError, StepGraphError, InvalidStepError, CorruptRecordError) as exc:
        print(f"marin reproduce: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(describe(reproduction)), flush=True)
    return EXIT_IDENTICAL if reproduction.comparison.identical else EXIT_DIFFERENT


__all__ = ["register", "reproduce_command"]
