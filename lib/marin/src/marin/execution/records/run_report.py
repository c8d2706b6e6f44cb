"""What one run did: one :class:`Outcome` per step, gathered in a :class:`RunReport`.

A step that ran (or failed) in this run also says how many attempts it took and how they ended
(:attr:`StepOutcome.attempts`), read from the attempt records in its folder: iris retries a
preempted step without the step failing, so the summary is where a run says it was preempted
("checkpoints/tiny ran in 3 attempts, 2 preempted"). A run that leaves a step failed raises
:class:`StepRunFailed`, which carries the report, once all runnable work is done.
"""

from __future__ import annotations

import collections
import enum
import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from iris.attempt_log import AttemptTally, attempt_records

from marin.errors import MarinError
from marin.execution.records.executor_files import read_status


class Outcome(enum.StrEnum):
    """What happened to one step in one run (a string, so ``outcome == "ran"`` also reads right)."""

    RAN = "ran"
    CACHED = "cached"  # SUCCESS for its identity already, made by this or another runner
    FAILED = "failed"
    DEP_FAILED = "dep_failed"  # not run: a dependency failed
    WOULD_RUN = "would_run"  # dry run only
    NOT_NEEDED = "not_needed"  # neither read nor run: only finished steps depend on it

    @property
    def succeeded(self) -> bool:
        """Its output is there for dependents to use."""
        return self in (Outcome.RAN, Outcome.CACHED)

    @property
    def blocks_dependents(self) -> bool:
        """Its dependents must not run."""
        return self in (Outcome.FAILED, Outcome.DEP_FAILED)


@dataclass
class StepOutcome:
    name: str
    identity: str
    output_path: str
    outcome: Outcome
    error: str | None = None
    seconds: float = 0.0
    result: Any = None
    finished_at: float = field(default_factory=time.time)  # made when the step's attempt ended
    first_attempt: int | None = None  # the attempt the runner itself began in this run, if it ran the step itself

    @functools.cached_property
    def attempts(self) -> AttemptTally:
        """This run's attempts at the step, counted by how they ended (none for a step that did not run).

        The attempts of the iris job the step's status names (the one this run submitted or adopted,
        earlier attempts of an adopted job included); for a step the runner ran itself, the attempts
        begun while this run tried it.
        """
        if self.outcome not in (Outcome.RAN, Outcome.FAILED):
            return AttemptTally()
        try:
            records = attempt_records(self.output_path)
            status = read_status(self.output_path)
        except Exception:  # noqa: BLE001 - a summary line is never a reason for the run to fail
            return AttemptTally()
        began = self.finished_at - self.seconds - 1.0  # a second for clocks of other machines
        job = status.job if status is not None else None
        of_job = [record for record in records if job is not None and record.job_id == job]
        # A job this run waited on was still running when it began; one of an earlier run had ended.
        if any(record.ended_at is None or record.ended_at >= began for record in of_job):
            return AttemptTally.of(of_job)
        # Attempts the runner began itself are numbered: this run's are those from the first it began.
        if self.first_attempt is None:
            return AttemptTally()
        return AttemptTally.of([record for record in records if record.job_id is None and record.attempt >= self.first_attempt])

    def attempts_text(self) -> str:
        """``checkpoints/tiny ran in 3 attempts, 2 preempted``, or ``""`` when one attempt did it all."""
        tally = self.attempts
        if not tally.eventful:
            return ""
        verb = "ran in" if self.outcome is Outcome.RAN else "failed after"
        return f"{self.name} {verb} {tally.describe()}"


class RunReport:
    """What one ``run`` did, per step: the steps it needed in topological order, then those it did not.

    The lines of steps a run did not need are made when first read (:meth:`add_not_needed`): a
    sweep's rerun has thousands, and most runs only ask for the summary.
    """

    def __init__(self, outcomes: Iterable[StepOutcome] = (), *, dry_run: bool = False, prefix: str = "") -> None:
        self._outcomes = list(outcomes)
        self._not_needed: Sequence[_NotNeeded] = ()
        self.dry_run = dry_run
        self.prefix = prefix

    @property
    def outcomes(self) -> list[StepOutcome]:
        self._make_not_needed_lines()
        return self._outcomes

    def add_not_needed(self, steps: Sequence[_NotNeeded]) -> None:
        """Steps the run neither read nor ran, listed after all others; each says its line with ``outcome``."""
        self._make_not_needed_lines()  # any added before keep their place
        self._not_needed = steps

    def _make_not_needed_lines(self) -> None:
        if self._not_needed:
            self._outcomes.extend(step.outcome(Outcome.NOT_NEEDED) for step in self._not_needed)
            self._not_needed = ()

    def _names(self, outcome: Outcome) -> list[str]:
        return [o.name for o in self.outcomes if o.outcome == outcome]

    @property
    def ran(self) -> list[str]:
        return self._names(Outcome.RAN)

    @property
    def cached(self) -> list[str]:
        return self._names(Outcome.CACHED)

    @property
    def failed(self) -> list[str]:
        return self._names(Outcome.FAILED)

    @property
    def dep_failed(self) -> list[str]:
        return self._names(Outcome.DEP_FAILED)

    @property
    def would_run(self) -> list[str]:
        return self._names(Outcome.WOULD_RUN)

    @property
    def not_needed(self) -> list[str]:
        return self._names(Outcome.NOT_NEEDED)

    @property
    def ok(self) -> bool:
        return not any(o.outcome.blocks_dependents for o in self._outcomes)  # a step not needed never failed

    def outcome_of(self, name: str) -> StepOutcome:
        for outcome in self.outcomes:
            if outcome.name == name:
                return outcome
        raise KeyError(f"No step named {name!r} in this run.")

    def summary(self) -> str:
        counts = collections.Counter(o.outcome for o in self._outcomes)
        counts[Outcome.NOT_NEEDED] += len(self._not_needed)
        if self.dry_run:
            shown = [(Outcome.WOULD_RUN, "to run"), (Outcome.CACHED, "cached"), (Outcome.FAILED, "failed")]
        else:
            shown = [(Outcome.RAN, "ran"), (Outcome.CACHED, "cached"), (Outcome.FAILED, "failed"), (Outcome.DEP_FAILED, "dep-failed")]
        parts = [f"{counts[kind]} {label}" for kind, label in shown]
        if counts[Outcome.NOT_NEEDED]:
            parts.append(f"{counts[Outcome.NOT_NEEDED]} not needed")
        text = ", ".join(parts)
        if not self.dry_run:
            # Only a step tried in this run has attempts to tell of (a sweep's rerun has thousands that were not).
            tried = (outcome for outcome in self._outcomes if outcome.outcome in (Outcome.RAN, Outcome.FAILED))
            eventful = [outcome.attempts_text() for outcome in tried]
            text += "".join(f"; {line}" for line in eventful if line)
        return text

    def __repr__(self) -> str:
        return f"RunReport({self.summary()!r}, dry_run={self.dry_run}, prefix={self.prefix!r})"


class _NotNeeded(Protocol):
    def outcome(self, kind: Outcome) -> StepOutcome: ...


class StepRunFailed(MarinError, RuntimeError):
    """At least one step failed; ``.report`` says which, and which dependents did not run."""

    def __init__(self, report: RunReport) -> None:
        self.report = report
        lines = [f"{len(report.failed)} step(s) failed:"]
        for outcome in report.outcomes:
            if outcome.outcome == Outcome.FAILED:
                tally = outcome.attempts
                after = f" after {tally.describe()}" if tally.eventful else ""
                lines.append(f"  {outcome.name} ({outcome.output_path}){after}: {outcome.error}")
        if report.dep_failed:
            lines.append(f"Not run because a dependency failed: {', '.join(report.dep_failed)}")
        super().__init__("\n".join(lines))
