"""A run's summary counts the attempts each step took in this run, from the records in its folder."""

from __future__ import annotations

import json
import time
from pathlib import Path

from iris.attempt_log import RECORD_FILE, AttemptRecord, attempt_url
from marin.execution.records.run_report import Outcome, RunReport, StepOutcome, StepRunFailed


def _attempt(folder: Path, number: int, outcome: str, *, started: float, job: str | None = None) -> None:
    url = Path(attempt_url(str(folder), number))
    url.mkdir(parents=True)
    record = AttemptRecord(attempt=number, started_at=started, ended_at=started + 1, outcome=outcome, job_id=job,
                           job_attempt=number if job else None)
    (url / RECORD_FILE).write_text(record.to_json())


def _status(folder: Path, status: str, job: str | None = None) -> None:
    (folder / ".executor_status").write_text(json.dumps({"status": status, "time": time.time(), "job": job}))


def test_the_attempts_of_the_job_this_run_waited_on_are_counted_not_an_earlier_runs(tmp_path):
    now = time.time()
    _attempt(tmp_path, 1, "PREEMPTED", started=now - 3600, job="train-earlier")  # another run's job, long over
    _attempt(tmp_path, 2, "PREEMPTED", started=now - 20, job="train-now")
    _attempt(tmp_path, 3, "PREEMPTED", started=now - 10, job="train-now")
    _attempt(tmp_path, 4, "SUCCEEDED", started=now - 5, job="train-now")
    _status(tmp_path, "SUCCESS", job="train-now")
    ran = StepOutcome("checkpoints/tiny", "id", str(tmp_path), Outcome.RAN, seconds=25.0)
    report = RunReport(outcomes=[ran, StepOutcome("data/raw", "id2", str(tmp_path / "other"), Outcome.CACHED)])
    assert ran.attempts.describe() == "3 attempts, 2 preempted"
    assert report.summary() == "1 ran, 1 cached, 0 failed, 0 dep-failed; checkpoints/tiny ran in 3 attempts, 2 preempted"
    assert ran.attempts.preempted == 2


def test_a_step_that_ran_once_adds_nothing_and_a_failed_one_says_after_how_many(tmp_path):
    once, failed = tmp_path / "once", tmp_path / "failed"
    for folder in (once, failed):
        folder.mkdir()
    now = time.time()
    _attempt(once, 1, "FAILED", started=now - 60)  # an earlier run's attempt, the runner's own
    _attempt(once, 2, "SUCCEEDED", started=now - 2)
    _status(once, "SUCCESS")
    _attempt(failed, 1, "PREEMPTED", started=now - 8, job="j")
    _attempt(failed, 2, "FAILED", started=now - 4, job="j")
    _status(failed, "FAILED", job="j")
    # The runner began attempt 2 in this run: attempt 1 is not this run's.
    report = RunReport(outcomes=[StepOutcome("once", "a", str(once), Outcome.RAN, seconds=3.0, first_attempt=2),
                                 StepOutcome("broken", "b", str(failed), Outcome.FAILED, error="iris job j failed", seconds=9.0)])
    assert report.summary() == "1 ran, 0 cached, 1 failed, 0 dep-failed; broken failed after 2 attempts, 1 preempted, 1 failed"
    assert f"broken ({failed}) after 2 attempts, 1 preempted, 1 failed: iris job j failed" in str(StepRunFailed(report))


def test_a_failure_carried_over_from_an_earlier_run_counts_none_of_its_attempts(tmp_path):
    _attempt(tmp_path, 1, "PREEMPTED", started=time.time() - 600, job="old")
    _attempt(tmp_path, 2, "FAILED", started=time.time() - 500, job="old")
    _status(tmp_path, "FAILED", job="old")
    carried = StepOutcome("broken", "b", str(tmp_path), Outcome.FAILED, error="failed in an earlier run")
    assert carried.attempts.attempts == 0 and RunReport(outcomes=[carried]).summary().endswith("0 dep-failed")


def test_attempts_the_runner_began_itself_are_counted_from_the_first_of_this_run(tmp_path):
    now = time.time()
    _attempt(tmp_path, 1, "FAILED", started=now - 60)  # the run before this one
    _attempt(tmp_path, 2, "FAILED", started=now - 0.01)
    _attempt(tmp_path, 3, "FAILED", started=now - 0.005)
    _status(tmp_path, "FAILED")
    failed = StepOutcome("broken", "b", str(tmp_path), Outcome.FAILED, error="boom", seconds=0.02, first_attempt=2)
    assert failed.attempts.describe() == "2 attempts, 2 failed"
