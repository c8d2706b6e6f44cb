"""The writer of an attempt's logs: each replica's log is opened once, not once a write, and what
``append`` returned from is in the file already, redacted."""

from __future__ import annotations

import builtins
from pathlib import Path

from iris.attempt_log import AttemptLog, AttemptOutcome

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
