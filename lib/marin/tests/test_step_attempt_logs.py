"""Every attempt of a step the runner runs itself keeps its output in the step's ``.attempts/``:
what the step's thread printed and logged, its traceback, and how the attempt ended."""

from __future__ import annotations

import logging
import threading

from iris.attempt_log import list_attempts, read_log
from marin.execution.records.executor_files import read_status
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

logger = logging.getLogger("a_user_module")


def _log_text(output_path: str, attempt: int = -1) -> str:
    listing = list_attempts(output_path)[attempt]
    return b"".join(read_log(url) for url in listing.logs).decode()


def test_a_failed_attempt_keeps_its_output_and_traceback_and_a_rerun_adds_the_next_attempt(tmp_path):
    should_fail = [True]

    def flaky(output_path):
        print("printed by the step")
        logger.warning("logged by the step")
        if should_fail[0]:
            raise ValueError("the input is bad")
        return 1

    step = StepSpec("flaky", flaky)
    runner = StepRunner(prefix=str(tmp_path))
    report = runner.run([step], raise_on_failure=False)
    output = report.outcome_of("flaky").output_path
    (first,) = list_attempts(output)
    assert (first.record.outcome, first.record.exit_codes, first.record.engine) == ("FAILED", (1,), "local")
    assert "ValueError: the input is bad" in first.record.reason
    text = _log_text(output)
    assert "printed by the step" in text and "logged by the step" in text
    assert 'raise ValueError("the input is bad")' in text  # the traceback, with the failing line
    assert read_status(output).attempt == 1

    should_fail[0] = False
    runner.run([step])
    assert [a.record.outcome for a in list_attempts(output)] == ["FAILED", "SUCCEEDED"]
    assert read_status(output).attempt == 2 and read_status(output).status == "SUCCESS"


def test_a_silent_step_records_its_attempt_once_it_ends_and_a_talking_one_from_its_first_output(tmp_path):
    seen: dict[str, object] = {}

    def silent(ctx):
        step_folder = ctx.output_path.rsplit("/", 1)[0]
        seen["silent"] = (list_attempts(step_folder), read_status(step_folder).attempt)

    def talking(ctx):
        print("hello", flush=True)
        step_folder = ctx.output_path.rsplit("/", 1)[0]
        seen["talking"] = list_attempts(step_folder)

    report = StepRunner(prefix=str(tmp_path)).run([StepSpec("silent", silent), StepSpec("talking", talking)])
    assert seen["silent"] == ([], 1)  # while it ran: nothing in .attempts/, and the status named attempt 1
    (running,) = seen["talking"]
    assert running.record is not None and running.record.outcome is None  # opened with its first output
    (done,) = list_attempts(report.outcome_of("silent").output_path)
    assert (done.record.attempt, done.record.outcome, done.logs) == (1, "SUCCEEDED", ())
    assert list_attempts(report.outcome_of("talking").output_path)[0].record.outcome == "SUCCEEDED"


def test_steps_running_at_once_keep_only_their_own_output(tmp_path):
    both_running = threading.Barrier(2, timeout=30)

    def talker(word):
        def run(output_path):
            both_running.wait()  # so the two really print at the same time
            for _ in range(50):
                print(word)
                logger.warning(word)
            return word
        return run

    steps = [StepSpec("left", talker("LEFT-WORD")), StepSpec("right", talker("RIGHT-WORD"))]
    report = StepRunner(prefix=str(tmp_path)).run(steps, max_concurrent=2)
    left, right = (_log_text(report.outcome_of(name).output_path) for name in ("left", "right"))
    assert left.count("LEFT-WORD") == 100 and "RIGHT-WORD" not in left
    assert right.count("RIGHT-WORD") == 100 and "LEFT-WORD" not in right


def test_attempt_logs_are_kept_on_object_storage(s3_prefix):
    def noisy(output_path):
        print("kept in the bucket")
        return 0

    report = StepRunner(prefix=s3_prefix).run([StepSpec("noisy", noisy)])
    output = report.outcome_of("noisy").output_path
    assert output.startswith("s3://")
    (attempt,) = list_attempts(output)
    assert attempt.record.outcome == "SUCCEEDED"
    assert "kept in the bucket" in _log_text(output)


def test_marin_status_shows_the_job_and_attempt_of_a_running_step(tmp_path, capsys):
    import json

    from marin.cli import main
    from marin.execution.records.executor_files import write_info, write_status

    folder = tmp_path / "checkpoints" / "big-0123abcd"
    folder.mkdir(parents=True)
    write_info(str(folder), {"name": "checkpoints/big", "identity": "x" * 64})
    write_status(str(folder), "RUNNING", identity="x" * 64, attempt=3, job="checkpoints-big-0123abcd-20261201-1")
    assert main(["status", "--prefix", str(tmp_path)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "checkpoints/big" in line)
    assert "iris job checkpoints-big-0123abcd-20261201-1, attempt 3" in line and "marin logs checkpoints/big" in line
    assert main(["status", "--prefix", str(tmp_path), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert (record["attempt"], record["job"]) == (3, "checkpoints-big-0123abcd-20261201-1")
    # Submitted, its first attempt not started yet: the job is known already.
    write_status(str(folder), "RUNNING", identity="x" * 64, job="checkpoints-big-0123abcd-20261201-1")
    assert main(["status", "--prefix", str(tmp_path)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "checkpoints/big" in line)
    assert "iris job checkpoints-big-0123abcd-20261201-1, no attempt started yet" in line
