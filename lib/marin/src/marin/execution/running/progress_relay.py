"""A step running as a cluster job shows its progress on the runner's console, as a local step does.

A step the runner runs itself logs to the runner's console: the trainer's ``step 40/100  loss 5.27
... tokens/s ... ETA 0m07s`` every few steps. A step that runs as an iris job (on Slurm, Ray or the
local engine) writes the same lines into its attempt's log in the step folder, and the console
would say nothing between "runs as iris job" and "finished". :class:`ProgressRelay` reads that log
as it grows (replica 0's, from where it last stopped, a bounded amount per look) and relays its
progress lines, those that carry an ``ETA``, at most one every ``every_s`` seconds: the newest one
when the time comes (the first at once), and the last one an attempt wrote when it ends, so the
console ends on the step's final figures. The whole log is one ``marin logs STEP --follow`` away,
which the relay says once when it starts.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

from iris.attempt_log import list_attempts, read_log
from rigging.log import get_logger
from rigging.regular_files import RefusedFileError

logger = get_logger("marin.execution.step_runner")

#: The most often one step's progress is relayed, in seconds.
PROGRESS_EVERY_S = 30.0
#: The most of a log read in one look (a step that logs faster is caught up over the next looks).
READ_LIMIT_BYTES = 1 << 20
# A progress line: a rate and the time left (the trainer, evaluation, tokenization, ...).
PROGRESS = re.compile(r"\bETA\b")
# What the step's own logging puts before a message: "18:43:49 INFO levanter.trainer: ".
LOG_PREFIX = re.compile(r"^\d\d:\d\d:\d\d \w+ [\w.]+: ")


class ProgressRelay:
    """Relays the progress lines of ``step``'s iris job ``job_id`` (see the module docstring)."""

    def __init__(self, step: str, output_path: str, job_id: str, *, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.step = step
        self.output_path = output_path
        self.job_id = job_id
        self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self.clock = clock
        self._job_attempt: int | None = None
        self._log_url: str | None = None
        self._offset = 0
        self._partial = b""
        self._newest: str | None = None  # the newest progress line not relayed yet
        self._relayed_at = -math.inf

    def announce(self) -> None:
        logger.info("Step %s: its progress is shown here at most every %gs; the whole log: marin logs %s --follow",
                    self.step, self.every_s, self.step)

    def poll(self, job_attempt: int) -> None:
        """Read what the job's attempt ``job_attempt`` logged since the last look; relay its newest
        progress line if one is due."""
        if not self._follow(job_attempt):
            return
        self._read()
        if self._newest is not None and self.clock() - self._relayed_at >= self.every_s:
            self.flush()

    def ended(self, job_attempt: int) -> None:
        """Relay the last progress line of attempt ``job_attempt``, which ended: read from where the
        relay stopped, or from the start when the attempt began and ended between two looks."""
        if self._job_attempt is not None and job_attempt < self._job_attempt:
            return  # the relay has moved on to a later attempt
        if self._follow(job_attempt):
            while self._read() == READ_LIMIT_BYTES:  # to the log's end, however far behind: its last line counts
                pass
            self.flush()

    def _follow(self, job_attempt: int) -> bool:
        """Follow ``job_attempt``'s log from now on; whether its log is there to read."""
        if job_attempt != self._job_attempt:
            self.flush()  # the attempt before ended: its last figures first
            self._job_attempt, self._log_url, self._offset, self._partial = job_attempt, None, 0, b""
        if self._log_url is None:
            self._log_url = self._find_log(job_attempt)  # None while the attempt's folder is not there yet
        return self._log_url is not None

    def flush(self) -> None:
        """Relay the newest progress line not relayed yet, now (an attempt ended)."""
        if self._log_url is not None:
            self._read()
        if self._newest is None:
            return
        logger.info("Step %s: %s", self.step, self._newest)
        self._newest, self._relayed_at = None, self.clock()

    def _find_log(self, job_attempt: int) -> str | None:
        for listing in reversed(list_attempts(self.output_path)):
            record = listing.record
            if record is not None and record.job_id == self.job_id and record.job_attempt == job_attempt and listing.logs:
                return listing.logs[0]
        return None

    def _read(self) -> int:
        """Read the next part of the log (at most READ_LIMIT_BYTES); how many bytes it read."""
        try:
            data = read_log(self._log_url, self._offset, READ_LIMIT_BYTES)
        except (OSError, RefusedFileError):
            return 0  # a log that cannot be read now is looked at again at the next poll
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > READ_LIMIT_BYTES:
            self._partial = b""  # no progress line is that long: drop it rather than hold it
        for line in lines:
            text = line.decode("utf-8", errors="replace").rstrip()
            if PROGRESS.search(text):
                self._newest = " ".join(LOG_PREFIX.sub("", text).split())
        return len(data)
