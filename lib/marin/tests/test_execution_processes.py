"""Runners in separate processes: exactly-once execution and recovery from a SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from marin.execution.records.executor_files import read_status
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

RACE_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner

    counts = sys.argv[1]

    def work(name):
        def fn():
            with open(os.path.join(counts, name), "a") as handle:
                handle.write(f"{os.getpid()}\\n")
            time.sleep(0.3)
        return fn

    a = StepSpec("a", work("a"))
    b = StepSpec("b", work("b"), deps=[a])
    c = StepSpec("c", work("c"), deps=[a])
    d = StepSpec("d", work("d"), deps=[b, c])
    StepRunner(poll_s=0.05).run([d])
    """
)


def test_two_runner_processes_run_each_step_exactly_once(tmp_path):
    script, counts = tmp_path / "race.py", tmp_path / "counts"
    script.write_text(RACE_SCRIPT)
    counts.mkdir()
    env = {**os.environ, "MARIN_PREFIX": str(tmp_path / "prefix")}
    processes = [subprocess.Popen([sys.executable, str(script), str(counts)], env=env, cwd=tmp_path) for _ in range(2)]
    assert [p.wait(timeout=60) for p in processes] == [0, 0]
    for name in "abcd":
        assert len((counts / name).read_text().splitlines()) == 1, name


KILL_SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, time
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner

    def slow(output_path):
        (pathlib.Path(output_path) / "partial").write_text("half")
        pathlib.Path(sys.argv[1]).write_text("started")
        time.sleep(60)

    StepRunner(prefix=sys.argv[2]).run([StepSpec("victim", slow, hash_attrs={"k": 1})])
    """
)


def test_sigkilled_runner_leaves_no_success_and_rerun_completes(tmp_path):
    script, marker, prefix = tmp_path / "kill.py", tmp_path / "started", str(tmp_path / "prefix")
    script.write_text(KILL_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(marker), prefix], cwd=tmp_path)
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    calls = []
    step = StepSpec("victim", lambda: calls.append(1), hash_attrs={"k": 1})  # same identity, different code
    runner = StepRunner(prefix=prefix)  # default 60 s lease: the dead local holder is detected at once
    output = runner.output_path_for(step)
    assert read_status(output).status == "RUNNING"
    report = runner.run([step])
    assert report.ran == ["victim"] and calls == [1]
    assert read_status(output).status == "SUCCESS"


INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, time
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner

    def patient(ctx):
        pathlib.Path(sys.argv[1]).write_text("started")
        while True:
            ctx.check_lease()  # raises once the run is interrupted
            time.sleep(0.02)

    StepRunner(prefix=sys.argv[2]).run([StepSpec("patient", patient)])
    """
)


def start_runner_until_step_started(tmp_path, script_text: str) -> tuple[subprocess.Popen, str]:
    """Run ``script_text`` (argv: marker file, prefix) in a subprocess until its step has started."""
    script, marker, prefix = tmp_path / "runner.py", tmp_path / "started", str(tmp_path / "prefix")
    script.write_text(script_text)
    process = subprocess.Popen([sys.executable, str(script), str(marker), prefix], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the step did not start within 30 s"
    return process, prefix


def test_ctrl_c_stops_cooperative_steps_and_records_failure(tmp_path):
    process, prefix = start_runner_until_step_started(tmp_path, INTERRUPT_SCRIPT)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr
    status = read_status(StepRunner(prefix=prefix).output_path_for(StepSpec("patient", lambda: None)))
    assert status.status == "FAILED" and "interrupted" in status.error


STUBBORN_SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, time
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner

    def stubborn():
        pathlib.Path(sys.argv[1]).write_text("started")
        time.sleep(600)  # never checks the lease

    StepRunner(prefix=sys.argv[2]).run([StepSpec("stubborn", stubborn)])
    """
)


def test_second_ctrl_c_stops_a_step_that_ignores_the_first(tmp_path):
    process, prefix = start_runner_until_step_started(tmp_path, STUBBORN_SCRIPT)
    process.send_signal(signal.SIGINT)
    with pytest.raises(subprocess.TimeoutExpired):  # the first one waits for the running step
        process.wait(timeout=1.0)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "Ctrl-C again to stop at once" in stderr and "second Ctrl-C: exiting now" in stderr
    # Like a killed runner: the step is left RUNNING and the next run takes it over and finishes it.
    step = StepSpec("stubborn", lambda: None)
    runner = StepRunner(prefix=prefix)
    assert read_status(runner.output_path_for(step)).status == "RUNNING"
    assert runner.run([step]).ran == ["stubborn"]
