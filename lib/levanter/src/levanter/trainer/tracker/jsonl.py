"""``metrics.jsonl``: one JSON object per line, always on, the record every other tool reads.

Each step appears once. A run resumed from its checkpoint at step ``S`` first cuts the file back
to the records of steps ``<= S`` (the steps it is about to redo were logged by the killed attempt
and would otherwise appear twice); a fresh run (no checkpoint) that finds a file left by an
earlier attempt starts it afresh, with a warning.

A damaged file never stops a reader or a resume: a line that is not a JSON record (garbage left by a
bad disk or a crash) is skipped, and dropped when the file is cut, with a WARNING naming the file and
line; steps up to the checkpoint that have no record are reported as missing (they cannot be
recovered: the checkpoint holds the state, not the metrics). Only a torn last line, what a kill
mid-write leaves, passes without a warning.

On an object store (any URL but a local path), which cannot append, the tracker keeps the whole file
in memory and rewrites the object: before each checkpoint (the trainer calls :meth:`JsonlTracker.flush`),
at the end, and every ``rewrite_every_seconds`` in between. The stored file is therefore complete
at every checkpoint, so a resume can always cut it back to the checkpoint's step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
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
    file is first cut back to match it (see :func:`truncate_metrics`), then appended to. A URL
    ``path`` is rewritten whole instead (see the module docstring).
    """

    def __init__(self, path: str, *, resume_step: int | None = None, rewrite_every_seconds: float = 60.0):
        self.path = path
        self.rewrite_every_seconds = rewrite_every_seconds
        self._file = None
        local = fsx.is_local(path)
        if local:
            os.makedirs(os.path.dirname(fsx.absolute(path)), exist_ok=True)
        truncate_metrics(path, resume_step)
        if local:
            self._file = open(fsx.absolute(path), "a", encoding="utf-8")
        else:
            self._lines = [fsx.read_text(path) or ""]  # what is kept of an earlier attempt, then this run's lines
            self._unwritten = False
            self._last_rewrite = time.monotonic()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        line = json.dumps({"step": step, **{k: _plain(v) for k, v in metrics.items()}}) + "\n"
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
            return
        self._lines.append(line)
        self._unwritten = True
        if time.monotonic() - self._last_rewrite >= self.rewrite_every_seconds:
            self.flush()

    def flush(self) -> None:
        """Make the stored file hold every line logged so far (local files always do)."""
        if self._file is not None or not self._unwritten:
            return
        text = "".join(self._lines)
        self._lines = [text]
        fsx.atomic_write(self.path, text)
        self._unwritten = False
        self._last_rewrite = time.monotonic()

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        pass  # the summary goes to eval.json / the run's result, not into the per-step stream

    def close(self) -> None:
        if self._file is None:
            self.flush()
        elif not self._file.closed:
            self._file.close()


def _numbered_lines(path: str) -> list[tuple[int, str]]:
    """The file's non-blank lines with their 1-based numbers; undecodable bytes become U+FFFD, so a
    damaged line fails to parse on its own instead of failing the whole read."""
    with fsx.open_url(path, "r", encoding="utf-8", errors="replace") as f:
        return [(number, line) for number, line in enumerate(f, 1) if line.strip()]


def _parse(line: str) -> dict[str, Any] | None:
    """The record a line holds, or None when it is not a JSON object."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _records(path: str, lines: list[tuple[int, str]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each parsable line with its record; the others are skipped with a WARNING (but a torn last
    line, from a kill mid-write or a writer still at work, quietly)."""
    for index, (number, line) in enumerate(lines):
        record = _parse(line)
        if record is not None:
            yield line, record
        elif index < len(lines) - 1 or line.endswith("\n"):
            logger.warning("%s line %d is not a JSON record; skipped (it holds %.60r).", path, number, line)


def _step_ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1..3, 7"``."""
    ranges: list[list[int]] = []
    for step in steps:
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    return ", ".join(f"{first}..{last}" if last > first else str(first) for first, last in ranges)


def _warn_missing_steps(path: str, resume_step: int, logged: set[int]) -> None:
    missing = [step for step in range(1, resume_step + 1) if step not in logged]
    if missing:
        what = f"step {missing[0]} is" if len(missing) == 1 else f"steps {_step_ranges(missing)} are"
        logger.warning(
            "%s: %s missing from the metrics log (the run resumes from checkpoint step %d); those metrics "
            "cannot be recovered, training continues.", path, what, resume_step,
        )


def truncate_metrics(path: str, resume_step: int | None) -> int:
    """Drop the records a run resuming at ``resume_step`` will log again; returns how many went.

    Kept: records of steps ``<= resume_step`` and records without a step (they keep their place).
    ``resume_step=None`` (a fresh run) drops everything: records of an earlier attempt that left no
    checkpoint would mix with the new run's, and that attempt is redone from step 0 anyway. Lines
    that are not JSON records go too (a torn last line quietly, others with a WARNING), and steps
    ``1..resume_step`` without a record are reported. The file is replaced atomically, so a kill
    during the cut leaves the old file whole; it is rewritten only when something goes.
    """
    if not fsx.exists(path):
        if resume_step:
            _warn_missing_steps(path, resume_step, set())
        return 0
    numbered = _numbered_lines(path)
    lines = [line for _, line in numbered]
    kept: list[str] = []
    if resume_step is not None:
        logged: set[int] = set()
        for line, record in _records(path, numbered):
            step = record.get("step")
            if not isinstance(step, int) or step <= resume_step:
                kept.append(line if line.endswith("\n") else line + "\n")
                if isinstance(step, int):
                    logged.add(step)
        _warn_missing_steps(path, resume_step, logged)
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
            "Cut %s back to step %d (%d line(s) dropped): the resumed run logs the later steps again.",
            path, resume_step, dropped,
        )
    return dropped


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The file's records in order, skipping lines that are not JSON records (see the module docstring)."""
    return [record for _, record in _records(path, _numbered_lines(path))]
