"""Options a launcher (the ``marin run`` command) imposes on every ``StepRunner.run`` in a script.

``marin run script.py --dry-run`` cannot change the script's own call ``StepRunner().run(steps)``,
so it installs overrides here and runs the script; the runner reads them. Overrides win over the
script's own arguments because they are what the person at the terminal just asked for (a
``--dry-run`` that a script could silently undo would be dangerous). Under plain ``python`` there
are no overrides and the script's arguments apply.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RunOverrides:
    prefix: str | None = None
    dry_run: bool | None = None
    force_run_failed: bool | None = None
    run_only: str | None = None
    max_concurrent: int | None = None
    strict: bool | None = None


_current = RunOverrides()
_runs_started = 0


def current_overrides() -> RunOverrides:
    return _current


def note_run_started() -> None:
    global _runs_started
    _runs_started += 1


def runs_started() -> int:
    """How many ``StepRunner.run`` calls started in this process (the CLI warns when a script made none)."""
    return _runs_started


@contextlib.contextmanager
def run_overrides(**options: object) -> Iterator[RunOverrides]:
    """Apply ``options`` (fields of :class:`RunOverrides`; ``None`` means "not given") within the block."""
    global _current
    previous = _current
    _current = dataclasses.replace(previous, **{k: v for k, v in options.items() if v is not None})
    try:
        yield _current
    finally:
        _current = previous
