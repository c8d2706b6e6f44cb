"""What iris does after an attempt ends, and the line that says so (:mod:`iris.retries`)."""

from __future__ import annotations

from iris.attempt_log import AttemptOutcome, AttemptRecord, AttemptTally
from iris.retries import describe_exit_codes, replay


def _replayed(*attempts, preemption=10, failure=0):
    history = [(number, outcome, codes) for number, (outcome, codes) in enumerate(attempts, start=1)]
    return [verdict.describe() for verdict in replay(history, max_retries_preemption=preemption, max_retries_failure=failure)]


def test_each_budget_is_counted_apart_and_said_as_spent_of_allowed():
    lines = _replayed(("PREEMPTED", (75,)), ("FAILED", (1,)), ("PREEMPTED", (-15,)), ("SUCCEEDED", (0,)), failure=2)
    assert lines == [
        "PREEMPTED (exit 75); iris retries it, 1 of 10 preemptions spent",
        "FAILED (exit 1); iris retries it, 1 of 2 failures spent",
        "PREEMPTED (killed by SIGTERM); iris retries it, 2 of 10 preemptions spent",
        "SUCCEEDED",
    ]


def test_a_spent_budget_a_fence_and_a_stop_each_end_the_job():
    assert _replayed(("FAILED", (1,))) == ["FAILED (exit 1); no retries left (max_retries_failure is 0)"]
    assert _replayed(("TIMED_OUT", (1,)), ("TIMED_OUT", (1,)), failure=1)[-1] == (
        "TIMED_OUT (ran past its time limit, exit 1); no retries left, all 1 failure spent (max_retries_failure=1)")
    fenced = replay([(1, "FAILED", (77,))], max_retries_preemption=10, max_retries_failure=5)
    assert not fenced[0].retried
    assert fenced[0].describe() == "FAILED (exit 77); fenced off: its work belongs to another execution now; not retried"
    stopped = replay([(1, "STOPPED", (-15,))], max_retries_preemption=10, max_retries_failure=5)
    assert not stopped[0].retried and stopped[0].describe().startswith("STOPPED (killed by SIGTERM); stopped on request")


def test_a_running_attempt_ends_the_replay():
    assert len(replay([(1, "PREEMPTED", (75,)), (2, None, ())], max_retries_preemption=1, max_retries_failure=0)) == 1


def test_replicas_that_disagree_show_every_exit_code():
    assert describe_exit_codes((75, -15)) == "exit codes 75, -15"
    assert describe_exit_codes((75, 75)) == "exit 75"
    assert describe_exit_codes((None,)) == ""


def test_a_tally_counts_attempts_by_how_they_ended():
    records = [AttemptRecord(attempt=n, started_at=0.0, outcome=outcome)
               for n, outcome in enumerate(["PREEMPTED", "PREEMPTED", "FAILED", "TIMED_OUT", None, "SUCCEEDED"], 1)]
    tally = AttemptTally.of(records)
    assert (tally.attempts, tally.preempted, tally.failed, tally.running) == (6, 2, 2, 1)
    assert tally.describe() == "6 attempts, 2 preempted, 2 failed"
    assert not AttemptTally.of([AttemptRecord(attempt=1, started_at=0.0, outcome=AttemptOutcome.SUCCEEDED.value)]).eventful
    assert AttemptTally.of(records[:1]).eventful  # a single preempted attempt is worth telling
