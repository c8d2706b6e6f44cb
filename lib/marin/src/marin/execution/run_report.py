"""What one run did: one :class:`Outcome` per step, gathered in a :class:`RunReport`.

A run that leaves a step failed raises :class:`StepRunFailed`, which carries the report, once all
runnable work is done.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from marin.errors import MarinError


class Outcome(enum.StrEnum):
    """What happened to one step in one run (a string, so ``outcome == "ran"`` also reads right)."""

    RAN = "ran"
    CACHED = "cached"  # SUCCESS for its identity already, made by this or another runner
    FAILED = "failed"
    DEP_FAILED = "dep_failed"  # not run: a dependency failed
    WOULD_RUN = "would_run"  # dry run only

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


@dataclass
class RunReport:
    """What one ``run`` did, per step, in topological order."""

    outcomes: list[StepOutcome] = field(default_factory=list)
    dry_run: bool = False
    prefix: str = ""

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
    def ok(self) -> bool:
        return not self.failed and not self.dep_failed

    def outcome_of(self, name: str) -> StepOutcome:
        for outcome in self.outcomes:
            if outcome.name == name:
                return outcome
        raise KeyError(f"No step named {name!r} in this run.")

    def summary(self) -> str:
        if self.dry_run:
            parts = [f"{len(self.would_run)} to run", f"{len(self.cached)} cached", f"{len(self.failed)} failed"]
        else:
            parts = [f"{len(self.ran)} ran", f"{len(self.cached)} cached", f"{len(self.failed)} failed", f"{len(self.dep_failed)} dep-failed"]
        return ", ".join(parts)


class StepRunFailed(MarinError, RuntimeError):
    """At least one step failed; ``.report`` says which, and which dependents did not run."""

    def __init__(self, report: RunReport) -> None:
        self.report = report
        lines = [f"{len(report.failed)} step(s) failed:"]
        for outcome in report.outcomes:
            if outcome.outcome == Outcome.FAILED:
                lines.append(f"  {outcome.name} ({outcome.output_path}): {outcome.error}")
        if report.dep_failed:
            lines.append(f"Not run because a dependency failed: {', '.join(report.dep_failed)}")
        super().__init__("\n".join(lines))
