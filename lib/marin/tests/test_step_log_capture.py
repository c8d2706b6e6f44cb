"""What a step the runner runs itself prints is kept in its attempt log cheaply and completely:
gathered in memory and written in chunks (not one file open or write per line), redacted even where
a secret is split between writes, whole when the step ends, and visible while it runs."""

from __future__ import annotations

import builtins
import sys
import threading
import time
from pathlib import Path

import pytest

from iris.attempt_log import AttemptLog, list_attempts, read_log
from marin.execution.running import step_output
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

LINES = 10_000
WAIT_S = 30
SECRET = "split-secret-value-42"


def _log_text(output_path: str) -> str:
    (listing,) = list_attempts(output_path)
    return b"".join(read_log(url) for url in listing.logs).decode()


def counter(output_path):
    for i in range(LINES):
        print(i)
    return LINES


def flushing_counter(output_path):
    for i in range(LINES):
        print(i, flush=True)  # each line handed to the log on its own
    return LINES


@pytest.fixture
def log_opens(monkeypatch) -> list[str]:
    """Every opening of a replica log for writing, by anyone, while the test runs."""
    real_open = builtins.open
    opened: list[str] = []

    def counting_open(file, mode="r", *args, **kwargs):
        if str(file).endswith(".log") and "/.attempts/" in str(file) and any(flag in mode for flag in "wa+"):
            opened.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    return opened


@pytest.mark.parametrize("fn", [counter, flushing_counter])
def test_a_step_printing_many_lines_opens_its_log_a_few_times_not_once_per_line(tmp_path, log_opens, fn):
    report = StepRunner(prefix=str(tmp_path)).run([StepSpec("counter", fn)])
    output = report.outcome_of("counter").output_path
    assert _log_text(output).splitlines() == [str(i) for i in range(LINES)]
    # Created when the attempt begins, then written through one handle until the step ends.
    assert 1 <= len(log_opens) <= 3, f"{len(log_opens)} opens for {LINES} lines"


def test_printed_lines_reach_the_attempt_log_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(step_output, "FLUSH_INTERVAL_S", 3600.0)  # only size and the step's end hand output over
    monkeypatch.setattr(step_output, "CHUNK_CHARS", 16 * 1024)
    appended: list[int] = []
    real_append = AttemptLog.append

    def counting_append(self, replica, data):
        appended.append(len(data))
        return real_append(self, replica, data)

    monkeypatch.setattr(AttemptLog, "append", counting_append)
    report = StepRunner(prefix=str(tmp_path)).run([StepSpec("counter", counter)])
    text = _log_text(report.outcome_of("counter").output_path)
    assert text.splitlines() == [str(i) for i in range(LINES)]
    chunks = [size for size in appended if size]
    assert sum(chunks) == len(text.encode())
    # 48,890 bytes in chunks of at least 16 KiB: three, and the rest at the end.
    assert len(chunks) <= 4, f"{len(chunks)} appends for {LINES} lines"


def test_output_and_traceback_are_complete_when_the_step_raises(tmp_path):
    def fails_after_printing(output_path):
        for i in range(LINES):
            print(i)
        print("no newline at the end", end="")
        raise RuntimeError("failed after printing")

    report = StepRunner(prefix=str(tmp_path)).run([StepSpec("fails", fails_after_printing)], raise_on_failure=False)
    text = _log_text(report.outcome_of("fails").output_path)
    printed, _, after = text.partition("no newline at the end")
    assert printed.splitlines() == [str(i) for i in range(LINES)]
    # The traceback comes after everything printed before the exception, never inside it.
    assert after.startswith("Traceback") and "RuntimeError: failed after printing" in after


@pytest.mark.parametrize("chunk_bytes", [8, 64 * 1024])
def test_a_secret_split_between_writes_is_redacted(tmp_path, monkeypatch, chunk_bytes):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setattr(step_output, "CHUNK_CHARS", chunk_bytes)  # 8: every write is handed over at once

    def leaks_in_pieces(output_path):
        sys.stdout.write("key=" + SECRET[:7])
        sys.stdout.flush()  # hands the first half to the log on its own
        sys.stdout.write(SECRET[7:15])
        sys.stdout.flush()
        sys.stdout.write(SECRET[15:] + " done\n")
        print("starts like the secret but is not:", SECRET[:12] + "-other")

    report = StepRunner(prefix=str(tmp_path)).run([StepSpec("leaks", leaks_in_pieces)])
    text = _log_text(report.outcome_of("leaks").output_path)
    assert SECRET not in text and SECRET[:7] + SECRET[7:15] not in text
    assert text.splitlines() == ["key=*** done", f"starts like the secret but is not: {SECRET[:12]}-other"]


def test_output_reaches_the_log_while_the_step_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(step_output, "FLUSH_INTERVAL_S", 0.05)
    may_end = threading.Event()

    def waits(output_path):
        print("flushed", flush=True)
        print("left in the buffer")  # written out by the interval, not by the step's end
        assert may_end.wait(WAIT_S)
        return 0

    reports = []

    def run():
        reports.append(StepRunner(prefix=str(tmp_path)).run([StepSpec("waits", waits)]))

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + WAIT_S
        seen = b""
        while b"left in the buffer" not in seen and time.monotonic() < deadline:
            logs = list(Path(tmp_path).glob("waits-*/.attempts/001/replica-000.log"))
            seen = logs[0].read_bytes() if logs else b""
            time.sleep(0.02)
        assert seen == b"flushed\nleft in the buffer\n"
    finally:
        may_end.set()
        runner.join(timeout=WAIT_S)
    assert not runner.is_alive() and reports[0].outcome_of("waits").result == 0
