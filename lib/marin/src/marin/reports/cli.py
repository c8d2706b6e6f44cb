"""``marin report STEP-OR-PATH [--prefix URL] [--output DIR]``: write a trained model's card.

STEP-OR-PATH is a ``train_lm`` step's output folder (a local path or URL) or its step name (looked
up under the prefix; the newest finished run wins). The card tabulates every finished eval step
under the prefix that depends on that training run. It goes to ``--output``, a folder or URL
(default ``reports/<step folder name>``).
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_OK = 0
EXIT_USAGE = 2


def resolve_training_output(step_or_path: str, prefix: str | None = None) -> str:
    from rigging import filesystem as fsx
    from rigging.config.discovery import discover_config

    from marin.execution.records.catalog import find_step_folders
    from marin.execution.records.executor_files import STATUS_SUCCESS, read_status
    from marin.reports.model_card import ReportSourceError

    what = os.path.expanduser(step_or_path)
    fs, path = fsx.filesystem(what)
    if fs.isdir(path):
        return fsx.absolute(what)
    resolved_prefix = discover_config(prefix=prefix).prefix
    folders = find_step_folders(resolved_prefix, what.rstrip("/"))
    finished = [f for f in folders if (status := read_status(f)) is not None and status.status == STATUS_SUCCESS]
    if not finished:
        raise ReportSourceError(
            f"{step_or_path!r} is neither a folder nor a finished step under the prefix {resolved_prefix}. "
            "`marin status` lists the steps there; pass --prefix if your outputs are elsewhere."
        )
    return finished[0]


def report_command(args: argparse.Namespace) -> int:
    from rigging.filesystem import FilesystemUnavailableError

    from marin.reports.model_card import ReportSourceError, write_model_card

    try:
        training_output = resolve_training_output(args.step_or_path, args.prefix)
        output = args.output or f"reports/{training_output.rstrip('/').rsplit('/', 1)[-1]}"
        card = write_model_card(training_output, output)
    except (ReportSourceError, FilesystemUnavailableError) as exc:
        print(f"marin report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(card.summary())
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="write a trained model's card (Markdown + loss plot)",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("step_or_path", metavar="STEP-OR-PATH", help="a train_lm step's output folder or its step name")
    parser.add_argument("--prefix", help="where to look up step names (default: the discovered prefix)")
    parser.add_argument("--output", metavar="DIR", help="folder or URL for MODEL_CARD.md and loss_curves.png (default: reports/<run>)")
    parser.set_defaults(handler=report_command)
