"""The ``marin`` command.

Subcommands live in modules listed in :data:`COMMAND_MODULES`; each module exposes
``register(subparsers)``, which adds its parsers and sets ``handler=<function(args) -> exit code>``.
Arguments after a bare ``--`` are not parsed; they arrive as ``args.passthrough``.
To add a subcommand, write such a module and add its import path to the list.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from rigging.config.discovery import ConfigError
from rigging.log import setup_logging

COMMAND_MODULES: list[str] = [
    "marin.execution.command_line.commands",  # run, status, explain
    "marin.execution.command_line.reproduce_command",  # reproduce
    "marin.execution.command_line.step_logs",  # logs
    "marin.generate",  # generate
    "marin.reports.cli",  # report
    "marin.serve.cli",  # serve
    "marin.model_server.cli",  # serve-model
    "marin.slurm_command",  # slurm start, stop, status
    "marin.scaling.cli",  # scaling
    "marin.experiment.plan_command",  # plan
]


def installed_version() -> str:
    """The version of the installed ``marin`` distribution (``pyproject.toml``), or ``unknown`` when run from a bare tree."""
    try:
        return importlib.metadata.version("marin")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marin", description="Reproducible experiments as graphs of cached steps.")
    parser.add_argument("--version", action="version", version=f"marin {installed_version()}")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING or ERROR")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare "--" belongs to the program being launched (e.g. the script of
    # `marin run`), not to marin; argparse subparsers do not handle that split reliably.
    passthrough: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, passthrough = argv[:split], argv[split + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.passthrough = passthrough
    setup_logging(args.log_level)
    try:
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        # A setting the user chose (MARIN_PREFIX, marin.yaml...) is unusable; the message names it.
        print(f"marin: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
