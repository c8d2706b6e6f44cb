"""Refusing work that local worker processes would start again: the missing ``__main__`` guard.

Worker processes started with ``spawn`` (or ``forkserver``) begin by re-running the user's script
under the name ``__mp_main__``. A script that starts its work (a data pipeline, ``client.map``)
at top level, outside ``if __name__ == "__main__":``, makes every worker start it again:
multiprocessing then kills the worker with a generic error, or, worse, the re-run blocks before
reaching that line (a step runner waiting for the lease its own parent holds) and the parent waits
for workers that never come. Both sides are checked here so the script fails at once with the fix:

* the parent, before starting any worker, looks at where its main thread is in the script;
* a worker, should it get as far as starting work on processes while re-running the script, refuses.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
import threading
import tokenize
from functools import lru_cache
from types import FrameType

from fray.errors import FrayError

GUARD = 'if __name__ == "__main__":'


class UnguardedMainError(FrayError, RuntimeError):
    """Work started where worker processes would start it again; says what to add."""


def _advice(script: str) -> str:
    return (
        f"Put the script's top-level work under the guard, so workers can import {script} without running it:\n\n"
        f"    {GUARD}\n"
        "        ...  # build and run the pipeline (or call StepRunner().run) here\n\n"
        'Or run the work in this process with backend="inline".'
    )


def check_parent_main_guard(start_method: str) -> None:
    """Raise :class:`UnguardedMainError` if the workers about to start would re-run this work."""
    if start_method == "fork":
        return  # forked workers copy the parent; nothing is re-run
    found = unguarded_top_level_line()
    if found is not None:
        script, line = found
        raise UnguardedMainError(
            f"{script}, line {line} starts work on worker processes outside {GUARD!r}. Each worker begins by "
            f"re-running {script}, so each would start that work again (or wait forever on work this process "
            f"holds). {_advice(script)}"
        )


def check_not_rerunning_main() -> None:
    """Raise :class:`UnguardedMainError` in a worker that is still re-running the user's script."""
    if _bootstrapping_worker():
        main = sys.modules.get("__mp_main__")
        script = getattr(main, "__file__", None) or "the script"
        raise UnguardedMainError(
            f"This is a worker process re-running {script} as it starts, and the script starts work on worker "
            f"processes outside {GUARD!r}. {_advice(script)}"
        )


def startup_failure_hint() -> str:
    """Why workers may die before running anything, for the parent's error message."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if script is None:
        return "the workers could not import what the tasks need"
    return (
        f"each worker starts by re-running {script}; if the script starts work at top level, put that work under "
        f"{GUARD!r}"
    )


def _bootstrapping_worker() -> bool:
    # multiprocessing marks a spawned child as inheriting while it re-runs the script, and tests
    # the same flag for its own "bootstrapping phase" error; it is the only reliable sign.
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def unguarded_top_level_line() -> tuple[str, int] | None:
    """(script, line) when the main thread runs the script's top-level code outside any condition.

    Spawned workers would re-run that line; callers that pick a backend themselves can choose to run
    in-process instead.
    """
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if main is None or script is None:
        return None  # an interactive session or `python -c`: workers have no script to re-run
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if spec_name == "__main__" or spec_name.endswith(".__main__"):
        return None  # multiprocessing does not re-run a package's __main__ module
    frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    filename = frame.f_code.co_filename
    try:
        spans = _conditional_spans(filename, os.stat(filename).st_mtime_ns)
    except OSError:
        return None
    if spans is None or any(start <= line <= end for start, end in spans):
        return None  # under some condition (the guard, or one we cannot judge): leave it to the worker check
    return script, line


# Statements and expressions that may keep a worker's re-run from reaching a line.
_CONDITIONAL = (ast.If, ast.While, ast.Match, ast.ExceptHandler, ast.IfExp, ast.BoolOp)


@lru_cache(maxsize=8)
def _conditional_spans(filename: str, mtime_ns: int) -> tuple[tuple[int, int], ...] | None:
    try:
        with tokenize.open(filename) as handle:
            tree = ast.parse(handle.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None
    return tuple(
        (node.lineno, node.end_lineno or node.lineno) for node in ast.walk(tree) if isinstance(node, _CONDITIONAL)
    )
