"""``metrics.jsonl``: one JSON object per line, always on, the record every other tool reads.

Each step appears once. A run resumed from its checkpoint at step ``S`` first cuts the file back
to the records of steps ``<= S`` (the steps it is about to redo were logged by the killed attempt
and would otherwise appear twice); a fresh run (no checkpoint) that finds a file left by an
earlier attempt starts it afresh, with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping

from rigging import filesystem as fsx

logger = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    # NaN/inf are not JSON; writing null keeps every line parseable by strict readers.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlTracker:
    """Appends to ``path`` and flushes each line, so a killed run leaves every completed step on disk.

    ``resume_step`` is the checkpoint step the run resumes from, or ``None`` for a fresh run; the
    file is first cut back to match it (see :func:`truncate_metrics`), then appended to.
    """

    def __init__(self, path: str, *, resume_step: int | None = None):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        truncate_metrics(path, resume_step)
        self._file = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        pass  # the summary goes to eval.json / the run's result, not into the per-step stream

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def truncate_metrics(path: str, resume_step: int | None) -> int:
    """Drop the records a run resuming at ``resume_step`` will log again; returns how many went.

    Kept: records of steps ``<= resume_step`` and records without a step (they keep their place).
    ``resume_step=None`` (a fresh run) drops everything: records of an earlier attempt that left no
    checkpoint would mix with the new run's, and that attempt is redone from step 0 anyway. A torn
    last line (the writer killed mid-line) is dropped too. The file is replaced atomically, so a
    kill during the cut leaves the old file whole; it is rewritten only when something goes.
    """
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    kept: list[str] = []
    if resume_step is not None:
        for index, line in enumerate(lines):
            try:
                record = json.loads(line)
            except ValueError:
                if index < len(lines) - 1:  # only the last line can be torn by a kill mid-write
                    kept.append(line)
                continue
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(step, int) or step <= resume_step:
                kept.append(line if line.endswith("\n") else line + "\n")
    dropped = len(lines) - len(kept)
    if dropped or "".join(kept) != "".join(lines):  # also mends a last line without its newline
        fsx.atomic_write(path, "".join(kept))
    if dropped and resume_step is None:
        logger.warning(
            "%s held %d record(s) of an earlier attempt that left no checkpoint; starting it afresh "
            "(this run begins at step 0).", path, dropped,
        )
    elif dropped:
        logger.info(
            "Dropped %d record(s) after step %d from %s: the resumed run logs those steps again.",
            dropped, resume_step, path,
        )
    return dropped


def read_metrics(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
