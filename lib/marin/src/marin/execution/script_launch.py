"""Run a user's script as ``python SCRIPT.py ARGS`` would, inside a launch (see :mod:`run_defaults`).

The one way the command line starts a script: ``marin run`` to run its steps, ``marin reproduce``
to read which steps it declares. The script sees the ``sys.argv`` and ``sys.path[0]`` that
``python`` would give it, and ``MARIN_PREFIX`` set to the launch's prefix (for anything in the
script, or its subprocesses, that reads the prefix itself); all three are restored afterwards,
whatever the script raised.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from marin.execution.run_defaults import Launch, RunOverrides, launch


def run_script(
    script: Path,
    script_args: Sequence[str],
    overrides: RunOverrides,
    *,
    take_run: Callable[[Any, list[Any]], Any] | None = None,
) -> Launch:
    """Run ``script`` as ``__main__`` inside ``launch(overrides, take_run=take_run)``; the launch, once it ended."""
    saved_argv, saved_path, saved_prefix = sys.argv, list(sys.path), os.environ.get("MARIN_PREFIX")
    if overrides.prefix:
        os.environ["MARIN_PREFIX"] = overrides.prefix
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        with launch(overrides, take_run=take_run) as launched:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_prefix is None:
            os.environ.pop("MARIN_PREFIX", None)
        else:
            os.environ["MARIN_PREFIX"] = saved_prefix
    return launched


__all__ = ["run_script"]
