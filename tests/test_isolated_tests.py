"""The suite's ``isolated`` marker (conftest.py): a marked test runs in a child pytest process that is
killed hard when it stalls (it uses no CPU for the marker's ``idle_s``, or runs past its ``timeout_s``),
so a test stuck where pytest's timeout cannot reach it fails, named, instead of hanging the suite; its
outcome and output come back as if it had run in place."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TESTS = textwrap.dedent(
    """
    import os
    import signal
    import time

    import pytest

    IN_CHILD = "MARIN_TEST_ISOLATED_REPORTS"


    def test_runs_in_place():
        assert IN_CHILD not in os.environ


    @pytest.mark.isolated(timeout_s=8)
    def test_runs_in_a_child():
        print("said in the child")
        assert IN_CHILD in os.environ


    @pytest.mark.isolated(timeout_s=8)
    @pytest.mark.parametrize("n", [1, 2])
    def test_fails_in_a_child(n):
        assert n == 1, "two is not one"


    @pytest.mark.isolated(timeout_s=8)
    def test_stalls_where_no_signal_reaches():
        # As a thread waiting in XLA:CPU's collectives: pytest-timeout's SIGALRM is never handled.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(600)
    """
)


def run_with_the_suites_conftest(tmp_path: Path, tests: str, *, pytest_timeout_s: int) -> tuple[int, str]:
    """Run ``tests`` as test_marked.py beside a copy of the suite's conftest.py: (exit code, output)."""
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(
        f"""
        [tool.pytest.ini_options]
        addopts = "--import-mode=importlib -ra --strict-markers"
        markers = ["isolated(timeout_s=600): in a child process killed after timeout_s", "slow: slow"]
        timeout = {pytest_timeout_s}
        """))
    (tmp_path / "test_marked.py").write_text(tests)
    run = subprocess.run([sys.executable, "-m", "pytest", "test_marked.py", "-rA", "-p", "no:cacheprovider"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout + run.stderr


def test_an_isolated_test_that_stalls_is_killed_and_the_others_report_as_usual(tmp_path):
    returncode, out = run_with_the_suites_conftest(tmp_path, TESTS, pytest_timeout_s=600)
    assert returncode == 1, out[-4000:]
    assert "PASSED test_marked.py::test_runs_in_place" in out
    assert "PASSED test_marked.py::test_runs_in_a_child" in out and "said in the child" in out
    assert "PASSED test_marked.py::test_fails_in_a_child[1]" in out
    assert "FAILED test_marked.py::test_fails_in_a_child[2]" in out and "two is not one" in out
    assert "FAILED test_marked.py::test_stalls_where_no_signal_reaches" in out
    # Killed, run again in a fresh child (a stall in XLA does not repeat), and killed again.
    assert "killed (SIGKILL) after 8 s in the child process that ran it (stalled?), 2 time(s)" in out
    assert "2 failed, 3 passed" in out  # within the run's 300 s: the stalled test's 600 s sleep never ran out


STALLS_ONCE = textwrap.dedent(
    """
    import pathlib
    import signal
    import time

    import pytest


    @pytest.mark.isolated(timeout_s=8)
    def test_stalls_in_its_first_child_only():
        mark = pathlib.Path(__file__).with_name("stalled-once")
        if not mark.exists():
            mark.write_text("")
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(600)
    """
)


def test_a_test_that_stalls_once_passes_in_a_second_child_and_pytest_timeout_never_fires_first(tmp_path):
    # pytest-timeout's limit below the child's: before, its alarm fired in the parent while it waited
    # on the child, and the exception ended the whole run (INTERNALERROR) instead of one test.
    returncode, out = run_with_the_suites_conftest(tmp_path, STALLS_ONCE, pytest_timeout_s=5)
    assert returncode == 0, out[-4000:]
    assert "INTERNALERROR" not in out
    assert "PASSED test_marked.py::test_stalls_in_its_first_child_only" in out
    assert (tmp_path / "stalled-once").exists()  # it did stall in the first child


STALLS_AT_EXIT = textwrap.dedent(
    """
    import atexit
    import signal
    import time

    import pytest


    def stall():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(600)


    @pytest.mark.isolated(timeout_s=8)
    def test_ends_then_its_process_stalls_at_exit():
        atexit.register(stall)
    """
)


def test_a_child_killed_after_its_last_test_ended_is_not_run_again(tmp_path):
    # Every test had ended: a second child would have had no test to run, and pytest given none runs
    # the whole folder (here the test again, reported twice).
    returncode, out = run_with_the_suites_conftest(tmp_path, STALLS_AT_EXIT, pytest_timeout_s=600)
    assert returncode == 0, out[-4000:]
    assert "PASSED test_marked.py::test_ends_then_its_process_stalls_at_exit" in out
    assert "1 passed" in out and "2 passed" not in out


IDLE_AND_BUSY = textwrap.dedent(
    """
    import signal
    import time

    import pytest


    @pytest.mark.isolated(timeout_s=120, idle_s=2)
    def test_computes_for_longer_than_idle_s():
        busy_until = time.monotonic() + 4
        while time.monotonic() < busy_until:
            sum(range(10_000))


    @pytest.mark.isolated(timeout_s=120, idle_s=2)
    def test_waits_without_using_the_cpu():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(600)
    """
)


def test_a_child_that_uses_no_cpu_for_idle_s_is_killed_and_one_that_computes_is_not(tmp_path):
    returncode, out = run_with_the_suites_conftest(tmp_path, IDLE_AND_BUSY, pytest_timeout_s=600)
    assert returncode == 1, out[-4000:]
    assert "PASSED test_marked.py::test_computes_for_longer_than_idle_s" in out
    assert "FAILED test_marked.py::test_waits_without_using_the_cpu" in out
    # Killed for idling, in both children, long before its 120 s limit.
    assert re.search(r"killed \(SIGKILL\): the child process that ran it used 0\.0\d CPU-s in \d s \(stalled\), 2 time\(s\)",
                     out), out[-4000:]
    assert "after 120 s" not in out
