"""Run a user's script as ``python SCRIPT.py ARGS`` would, inside a launch (see :mod:`run_defaults`).

The one way the command line starts a script: ``marin run`` to run its steps, ``marin reproduce``
and ``marin plan`` to read which steps it declares (:func:`declared_steps`, which runs none). The script sees the ``sys.argv`` and ``sys.path[0]`` that
``python`` would give it, and ``MARIN_PREFIX`` set to the launch's prefix (for anything in the
script, or its subprocesses, that reads the prefix itself); all three are restored afterwards,
whatever the script raised.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin.execution.planning.run_defaults import Launch, RunOverrides, launch
from marin.execution.records.run_report import RunReport
from marin.execution.planning.step_graph import collect_steps


def run_script(
    script: Path,
    script_args: Sequence[str],
    overrides: RunOverrides,
    *,
    take_run: Callable[[Any, list[Any]], Any] | None = None,
) -> Launch:
    """Run ``script`` as ``__main__`` inside ``launch(overrides, take_run=take_run)``; the launch, once it ended."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        with prefix_in_environment(overrides.prefix), launch(overrides, take_run=take_run) as launched:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return launched


@dataclass
class _Declared:
    """Every step a script's runs declared, with the runner each was given to."""

    steps: list[tuple[Any, Any]] = field(default_factory=list)  # (StepRunner, StepSpec)

    def take(self, runner: Any, roots: list[Any]) -> RunReport:
        known = {spec.identity for _, spec in self.steps}
        self.steps.extend((runner, spec) for spec in collect_steps(roots) if spec.identity not in known)
        return RunReport(dry_run=True, prefix=runner.prefix)


def declared_steps(script: Path, script_args: Sequence[str], overrides: RunOverrides) -> tuple[list[tuple[Any, Any]], Launch]:
    """Every step ``script`` declares, each with the runner it was handed to (dependencies included,
    each once), and the launch: its runs return a dry run's report and run nothing."""
    declared = _Declared()
    launched = run_script(script, script_args, overrides, take_run=declared.take)
    return declared.steps, launched


@contextlib.contextmanager
def prefix_in_environment(prefix: str | None) -> Iterator[None]:
    """``MARIN_PREFIX`` set to ``prefix`` (when given) for the block, as it was afterwards."""
    saved = os.environ.get("MARIN_PREFIX")
    if prefix:
        os.environ["MARIN_PREFIX"] = prefix
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MARIN_PREFIX", None)
        else:
            os.environ["MARIN_PREFIX"] = saved


__all__ = ["declared_steps", "prefix_in_environment", "run_script"]
