"""Progress for a person watching: a bar on a terminal, the usual log lines everywhere else.

Long work (a pipeline's shards, training steps, evaluation batches) asks :func:`terminal_bar` for
a bar. On a terminal it gets a tqdm bar on stderr and updates it; anywhere else (a file, a pipe, a
job's log, a test) it gets ``None`` and logs its progress lines as before, so logs stay greppable
and nothing draws control characters into them. ``MARIN_PROGRESS=0`` turns bars off on a terminal
too; ``MARIN_PROGRESS=1`` asks for them even when stderr does not look like one.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def bars_wanted() -> bool:
    """Whether progress is shown as bars: ``MARIN_PROGRESS`` if set, else whether stderr is a terminal."""
    setting = os.environ.get("MARIN_PROGRESS", "").strip().lower()
    if setting in _OFF:
        return False
    if setting in _ON:
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def terminal_bar(total: int | None, description: str, unit: str = "it") -> Any:
    """A tqdm bar on stderr when :func:`bars_wanted`, else ``None`` (then log lines instead)."""
    if not bars_wanted():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=True)
