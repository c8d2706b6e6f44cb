"""The runner's relay of a cluster step's progress lines (marin.execution.running.progress_relay)."""

from __future__ import annotations

import logging

from iris.attempt_log import AttemptLog
from marin.execution.running.progress_relay import READ_LIMIT_BYTES, ProgressRelay


def test_an_attempt_that_ended_unfollowed_shows_the_last_line_of_a_log_longer_than_one_read(tmp_path, caplog):
    folder = str(tmp_path / "step")
    attempt = AttemptLog.begin(folder, job_id="job-1", job_attempt=1)
    noise = b"x" * 1000 + b"\n"
    attempt.append(0, b"12:00:00 INFO levanter.trainer: step 1/3  loss 5.0000  ETA 0m02s\n")
    attempt.append(0, noise * (2 * READ_LIMIT_BYTES // len(noise)))  # two reads' worth before the last line
    attempt.append(0, b"12:00:09 INFO levanter.trainer: step 3/3  loss 4.0000  ETA 0m00s\n")
    attempt.flush()

    relay = ProgressRelay("train", folder, "job-1", every_s=30.0)
    with caplog.at_level(logging.INFO, logger="marin.execution.step_runner"):
        relay.ended(1)  # the attempt began and ended between two of the runner's looks
        relay.ended(1)  # told twice: nothing new to say
    assert [r.getMessage() for r in caplog.records] == ["Step train: step 3/3 loss 4.0000 ETA 0m00s"]
