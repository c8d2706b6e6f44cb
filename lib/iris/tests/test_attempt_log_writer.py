"""The writer of an attempt's logs: each replica's log is opened once, not once a write, and what
``append`` returned from is in the file already, redacted; an attempt may defer its folder and
opening record to its first output."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from iris.attempt_log import AttemptLog, AttemptOutcome, list_attempts

SECRET = "writer-secret-value-7"


def test_appends_go_through_one_open_file_and_are_readable_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    real_open = builtins.open
    opened: list[str] = []

    def counting_open(file, mode="r", *args, **kwargs):
        if str(file).endswith("replica-000.log") and any(flag in mode for flag in "wa+"):
            opened.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    log = AttemptLog.begin(str(tmp_path))
    path = Path(log.log_url(0))
    opened.clear()  # creating the empty log when the attempt begins is one more
    for i in range(1000):
        log.append(0, f"line {i}\n".encode())
        assert path.read_bytes().endswith(f"line {i}\n".encode())  # flushed, not waiting in a buffer
    log.append(0, SECRET[:5].encode())
    log.append(0, SECRET[5:].encode() + b" end\n")
    log.finish(AttemptOutcome.SUCCEEDED)
    assert len(opened) == 1
    assert path.read_bytes().endswith(b"line 999\n*** end\n")


def test_a_deferred_attempt_appears_with_its_first_output_or_once_it_ends(tmp_path):
    silent = AttemptLog.begin(str(tmp_path / "silent"), create_logs=False, opening_record=False)
    assert silent.attempt == 1 and not (tmp_path / "silent").exists()  # numbered, nothing written yet
    silent.finish(AttemptOutcome.SUCCEEDED, "done", (0,))
    (listing,) = list_attempts(str(tmp_path / "silent"))
    assert listing.record.outcome == "SUCCEEDED" and listing.logs == ()

    talking = AttemptLog.begin(str(tmp_path / "talking"), create_logs=False, opening_record=False)
    talking.append(0, b"")  # nothing to show: still nothing written
    assert not (tmp_path / "talking").exists()
    talking.append(0, b"hello\n")
    (listing,) = list_attempts(str(tmp_path / "talking"))
    assert listing.record is not None and not listing.record.finished  # opened with its first output, running
    assert Path(listing.logs[0]).read_bytes() == b"hello\n"
    talking.finish(AttemptOutcome.FAILED, "boom", (1,))
    assert list_attempts(str(tmp_path / "talking"))[0].record.outcome == "FAILED"
    assert AttemptLog.begin(str(tmp_path / "talking"), create_logs=False, opening_record=False).attempt == 2


def test_an_attempt_that_defers_its_record_cannot_make_its_logs_at_once(tmp_path):
    with pytest.raises(ValueError, match="create_logs=False"):
        AttemptLog.begin(str(tmp_path), opening_record=False)
