"""Whether iris runs a job again after one of its attempts ended, and the one line that says so.

Preemptions and other failures spend separate budgets, the job's ``max_retries_preemption`` and
``max_retries_failure``: the n-th preempted attempt is followed by another while n is at most
``max_retries_preemption``, the n-th failed or timed-out one while n is at most
``max_retries_failure``. An attempt in which a replica exited with :data:`FENCED_OFF_EXIT_CODE`
ends the job whatever its budgets (its work belongs to someone else now), and so does a stopped one.

The supervisor decides with :func:`judge`, one attempt at a time. Whoever reads a job later (the
runner that waits for a step's job, ``iris job status``) replays the same decisions from the
attempts' outcomes with :func:`replay`, so what they say is what the supervisor did.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from iris.attempt_log import AttemptOutcome
from iris.spec import FENCED_OFF_EXIT_CODE


class Budget(enum.Enum):
    """The budget an ended attempt spends (its noun in "1 of 10 preemptions spent")."""

    PREEMPTION = "preemption"
    FAILURE = "failure"

    @property
    def setting(self) -> str:
        return f"max_retries_{self.value}"


@dataclass(frozen=True)
class AttemptVerdict:
    """How one attempt of a job ended, and what iris does next because of it."""

    attempt: int  # the job's attempt number: 1, 2, ...
    outcome: AttemptOutcome
    exit_codes: tuple[int | None, ...]
    budget: Budget | None  # None for an attempt that spends nothing (it succeeded, or was stopped)
    spent: int = 0  # attempts that spent this budget so far, this one included
    allowed: int = 0  # the retries the budget allows

    @property
    def fenced_off(self) -> bool:
        return FENCED_OFF_EXIT_CODE in self.exit_codes

    @property
    def retried(self) -> bool:
        """Whether iris starts another attempt after this one."""
        return self.budget is not None and not self.fenced_off and self.spent <= self.allowed

    def consequence(self) -> str:
        """What follows the attempt, in words: ``iris retries it, 1 of 10 preemptions spent``."""
        if self.outcome is AttemptOutcome.SUCCEEDED:
            return "done"
        if self.outcome is AttemptOutcome.STOPPED:
            return "stopped on request (iris job stop, or the run that started it was interrupted); not retried"
        if self.fenced_off:
            return "fenced off: its work belongs to another execution now; not retried"
        noun = f"{self.budget.value}s" if self.allowed != 1 else self.budget.value
        if self.retried:
            return f"iris retries it, {self.spent} of {self.allowed} {noun} spent"
        if self.allowed == 0:
            return f"no retries left ({self.budget.setting} is 0)"
        return f"no retries left, all {self.allowed} {noun} spent ({self.budget.setting}={self.allowed})"

    def describe(self) -> str:
        """``PREEMPTED (exit 75); iris retries it, 1 of 10 preemptions spent``: callers put the subject first."""
        if self.outcome is AttemptOutcome.SUCCEEDED:
            return self.outcome.value
        why = [describe_exit_codes(self.exit_codes)]
        if self.outcome is AttemptOutcome.TIMED_OUT:
            why.insert(0, "ran past its time limit")
        said = ", ".join(part for part in why if part)
        return f"{self.outcome.value}{f' ({said})' if said else ''}; {self.consequence()}"


def describe_exit_codes(codes: Sequence[int | None]) -> str:
    """``exit 75``; ``killed by SIGTERM``; ``exit codes 75, 1`` for several replicas that did not agree."""
    known = [code for code in codes if code is not None]
    if not known:
        return ""
    if len(set(known)) > 1:
        return "exit codes " + ", ".join("?" if code is None else str(code) for code in codes)
    code = known[0]
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def judge(attempt: int, outcome: AttemptOutcome, exit_codes: Sequence[int | None], earlier: Sequence[AttemptVerdict],
          *, max_retries_preemption: int, max_retries_failure: int) -> AttemptVerdict:
    """The verdict on ``attempt``, given the verdicts on the job's ``earlier`` attempts."""
    codes = tuple(exit_codes)
    if outcome is AttemptOutcome.PREEMPTED:
        budget, allowed = Budget.PREEMPTION, max_retries_preemption
    elif outcome.spends_failure_budget:
        budget, allowed = Budget.FAILURE, max_retries_failure
    else:
        return AttemptVerdict(attempt, outcome, codes, None)
    spent = 1 + sum(1 for verdict in earlier if verdict.budget is budget)
    return AttemptVerdict(attempt, outcome, codes, budget, spent, allowed)


def replay(attempts: Iterable[tuple[int, str | None, Sequence[int | None]]], *, max_retries_preemption: int,
           max_retries_failure: int) -> list[AttemptVerdict]:
    """The verdicts on a job's ended attempts, from ``(attempt, outcome, exit codes)`` in order; an
    attempt without an outcome (still running) ends the list."""
    verdicts: list[AttemptVerdict] = []
    for attempt, outcome, codes in attempts:
        if outcome is None:
            break
        verdicts.append(judge(attempt, AttemptOutcome(outcome), codes, verdicts,
                              max_retries_preemption=max_retries_preemption, max_retries_failure=max_retries_failure))
    return verdicts
