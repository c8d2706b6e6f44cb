"""A run plans from the steps it is given down: what only finished steps depend on is not needed.

A finished step needs nothing from its dependencies, so a rerun reads the status of the steps it was
asked for and stops there; a dependency is read (and run if unfinished) only when something needed
and unfinished depends on it, or when it was asked for itself. ``strict`` reads every step.
"""

import shutil

import pytest

from marin.execution.records.executor_files import read_status
from marin.execution.step_runner import CodeChangedError, Outcome, StepRunner
from marin.execution.step_spec import StepSpec


def _pipeline(calls: list[str]) -> tuple[StepSpec, StepSpec, StepSpec]:
    """raw -> tokens -> model, each recording its call."""
    raw = StepSpec("data/raw", lambda: calls.append("raw"))
    tokens = StepSpec("data/tokens", lambda: calls.append("tokens"), deps=[raw])
    model = StepSpec("checkpoints/model", lambda: calls.append("model"), deps=[tokens])
    return raw, tokens, model


def _runner(tmp_path) -> StepRunner:
    return StepRunner(prefix=str(tmp_path / "prefix"), poll_s=0.05)


def test_a_finished_step_needs_nothing_from_its_dependencies(tmp_path):
    calls: list[str] = []
    raw, tokens, model = _pipeline(calls)
    runner = _runner(tmp_path)
    assert runner.run([model]).ran == ["data/raw", "data/tokens", "checkpoints/model"]

    # The intermediate outputs are deleted: the finished model still stands, and nothing is remade.
    shutil.rmtree(runner.output_path_for(raw))
    shutil.rmtree(runner.output_path_for(tokens))
    again = _runner(tmp_path).run([model])
    # Counted before their lines are made (the first read of the outcomes makes them), and after.
    assert again.ok and again.summary() == "0 ran, 1 cached, 0 failed, 0 dep-failed, 2 not needed"
    assert again.ran == [] and again.cached == ["checkpoints/model"]
    assert again.not_needed == ["data/raw", "data/tokens"]
    assert again.summary() == "0 ran, 1 cached, 0 failed, 0 dep-failed, 2 not needed"
    assert calls == ["raw", "tokens", "model"]
    outcome = again.outcome_of("data/raw")
    assert outcome.outcome is Outcome.NOT_NEEDED and outcome.output_path == runner.output_path_for(raw)
    assert [item.spec.name for item in runner.plan([model])] == ["checkpoints/model"]


def test_a_dependency_asked_for_is_read_and_remade(tmp_path):
    calls: list[str] = []
    raw, tokens, model = _pipeline(calls)
    runner = _runner(tmp_path)
    runner.run([model])
    shutil.rmtree(runner.output_path_for(tokens))
    calls.clear()
    again = runner.run([tokens, model])
    assert again.ran == ["data/tokens"] and again.cached == ["data/raw", "checkpoints/model"]
    assert again.not_needed == [] and calls == ["tokens"]


def test_an_unfinished_dependent_makes_its_dependencies_needed(tmp_path):
    calls: list[str] = []
    raw, tokens, model = _pipeline(calls)
    runner = _runner(tmp_path)
    runner.run([model])
    # A second model on the same data: its tokens are read (cached) though the first model is done.
    other = StepSpec("checkpoints/other", lambda: calls.append("other"), deps=[tokens])
    report = runner.run([model, other])
    assert report.ran == ["checkpoints/other"]
    assert sorted(report.cached) == ["checkpoints/model", "data/tokens"]
    assert report.not_needed == ["data/raw"]


def test_a_failed_dependency_of_a_finished_step_does_not_fail_the_run(tmp_path):
    calls: list[str] = []
    raw, tokens, model = _pipeline(calls)
    runner = _runner(tmp_path)
    runner.run([model])
    status_file = f"{runner.output_path_for(raw)}/.executor_status"
    with open(status_file) as handle:
        text = handle.read()
    with open(status_file, "w") as handle:
        handle.write(text.replace('"SUCCESS"', '"FAILED"'))
    assert read_status(runner.output_path_for(raw)).status == "FAILED"
    again = runner.run([model], force_run_failed=False)
    assert again.ok and again.cached == ["checkpoints/model"] and "data/raw" in again.not_needed


def test_dry_run_shows_steps_not_needed(tmp_path, capsys):
    calls: list[str] = []
    raw, tokens, model = _pipeline(calls)
    runner = _runner(tmp_path)
    runner.run([model])
    capsys.readouterr()
    plan = runner.run([model], dry_run=True)
    printed = capsys.readouterr().out
    assert plan.cached == ["checkpoints/model"] and plan.not_needed == ["data/raw", "data/tokens"]
    assert "Dry run under" in printed and "3 step(s)" in printed
    not_needed_lines = [line for line in printed.splitlines() if line.strip().startswith("not needed")]
    assert len(not_needed_lines) == 2 and runner.output_path_for(raw) in "\n".join(not_needed_lines)
    assert "2 not needed" in printed


def test_strict_reads_every_step_and_refuses_changed_code_in_a_dependency(tmp_path):
    namespace: dict = {}
    source = tmp_path / "steps.py"

    def pipeline(body: str) -> StepSpec:
        source.write_text(f"def prepare():\n    return {body}\n")
        namespace.clear()
        exec(compile(source.read_text(), str(source), "exec"), namespace)
        namespace["prepare"].__module__ = "user_steps"
        prepared = StepSpec("data/prepared", namespace["prepare"])
        return StepSpec("checkpoints/model", lambda: None, deps=[prepared])

    runner = _runner(tmp_path)
    runner.run([pipeline("1")])
    assert runner.run([pipeline("1")], strict=True).cached == ["data/prepared", "checkpoints/model"]
    changed = pipeline("2")
    # Not strict: the changed dependency is not needed, so it is neither read nor reported.
    assert runner.run([changed]).not_needed == ["data/prepared"]
    with pytest.raises(CodeChangedError, match="data/prepared"):
        runner.run([changed], strict=True)
