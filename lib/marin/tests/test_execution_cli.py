"""The `marin` command and the DESIGN §1 StepSpec program, run as real scripts."""

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from marin import cli
from marin.execution.planning import run_defaults
from marin.execution.records.executor_files import read_status

DESIGN_PROGRAM = textwrap.dedent(
    """
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner

    def preprocess():
        ...  # the user's own code

    preprocess_step = StepSpec(
        name="preprocess",
        fn=preprocess,
        deps=[],
        output_path="outputs/preprocess",
        hash_attrs={"param": 42},
    )
    StepRunner().run([preprocess_step])
    """
)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "MARIN_PREFIX"}
    env.update(extra)
    return env


def test_design_program_runs_unmodified_and_second_run_is_cached(tmp_path):
    script = tmp_path / "preprocess.py"
    script.write_text(DESIGN_PROGRAM)
    first = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    output = tmp_path / "marin-outputs" / "outputs" / "preprocess"
    assert "Step preprocess started" in first.stderr
    assert read_status(str(output)).status == "SUCCESS"
    status_before = (output / ".executor_status").read_text()

    second = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "Step preprocess cached" in second.stderr and "started" not in second.stderr
    assert (output / ".executor_status").read_text() == status_before


COUNTING_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner

    LOG = os.environ["COUNT_LOG"]
    ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 10

    def record(name):
        def fn():
            with open(LOG, "a") as handle:
                handle.write(name + "\\n")
        return fn

    data = StepSpec("data/rows", record("data"), hash_attrs={"rows": ROWS})
    model = StepSpec("train/model", record("train"), deps=[data], hash_attrs={"lr": 0.1})
    StepRunner().run([model])
    """
)


@pytest.fixture
def counting(tmp_path, monkeypatch):
    script = tmp_path / "count.py"
    script.write_text(COUNTING_SCRIPT)
    log = tmp_path / "count.log"
    monkeypatch.setenv("COUNT_LOG", str(log))
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)
    return script, log, tmp_path / "prefix"


def _calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_marin_run_options_reach_the_scripts_runner(counting, capsys):
    script, log, prefix = counting
    assert cli.main(["run", str(script), "--prefix", str(prefix), "--dry-run"]) == 0
    assert not prefix.exists() and _calls(log) == []
    assert "to run" in capsys.readouterr().out

    assert cli.main(["run", str(script), "--prefix", str(prefix), "--run-only", "^data/", "--max-concurrent", "1"]) == 0
    assert _calls(log) == ["data"]
    assert cli.main(["run", str(script), "--prefix", str(prefix)]) == 0
    assert _calls(log) == ["data", "train"]
    assert cli.main(["run", str(script), "--prefix", str(prefix), "--run-only", "no-such-step"]) == 2
    assert run_defaults.current_overrides() == run_defaults.RunOverrides()  # nothing leaks out of the command
    assert "MARIN_PREFIX" not in os.environ

    capsys.readouterr()
    assert cli.main(["status", "--prefix", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert "SUCCESS" in out and "data/rows" in out and "train/model" in out and str(prefix) in out


def test_launch_overrides_reach_the_runners_made_inside_it_and_no_others(tmp_path):
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    step = StepSpec("data/rows", lambda: None)
    overrides = run_defaults.RunOverrides(prefix=str(tmp_path / "asked"), dry_run=True)
    seen_by_thread = []
    with run_defaults.launch(overrides) as launched:
        inside = StepRunner(prefix=str(tmp_path / "script"))
        report = inside.run([step], dry_run=False)  # the launch wins over the script's arguments
        thread = threading.Thread(target=lambda: seen_by_thread.append(StepRunner(prefix=str(tmp_path)).overrides))
        thread.start()
        thread.join(timeout=30)
    assert inside.prefix == str(tmp_path / "asked") and report.dry_run and report.would_run == ["data/rows"]
    assert launched.runs_started == 1 and not (tmp_path / "asked").exists()
    # A thread the script starts itself, and anything after the block, see no overrides.
    assert seen_by_thread == [run_defaults.RunOverrides()]
    assert StepRunner(prefix=str(tmp_path)).overrides == run_defaults.RunOverrides()
    # Overrides given to the runner itself are used as they are.
    explicit = StepRunner(prefix=str(tmp_path / "script"), overrides=run_defaults.RunOverrides(dry_run=True))
    assert explicit.run([step]).dry_run and not (tmp_path / "script").exists()


def test_marin_explain_shows_tree_and_what_changed(counting, capsys):
    script, log, prefix = counting
    assert cli.main(["run", str(script), "--prefix", str(prefix), "--", "10"]) == 0
    assert cli.main(["run", str(script), "--prefix", str(prefix), "--", "20"]) == 0
    assert _calls(log) == ["data", "train", "data", "train"]
    capsys.readouterr()

    assert cli.main(["explain", "train/model", "--prefix", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert "train/model" in out and "lr = 0.1" in out and "dep data/rows" in out and "rows = " in out
    assert "2 outputs exist" in out

    assert cli.main(["explain", "train/model", "train/model", "--prefix", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert "train/model -> data/rows: hash_attrs.rows changed 10 -> 20" in out

    assert cli.main(["explain", "no/such/step", "--prefix", str(prefix)]) == 2


def test_marin_run_reports_failure_with_exit_code(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fail.py"
    script.write_text(
        "from marin.execution.step_spec import StepSpec\n"
        "from marin.execution.step_runner import StepRunner\n"
        "def boom():\n    raise RuntimeError('broken on purpose')\n"
        "StepRunner().run([StepSpec('boom', boom)])\n"
    )
    monkeypatch.chdir(tmp_path)
    prefix = str(tmp_path / "prefix")
    assert cli.main(["run", str(script), "--prefix", prefix]) == 1
    assert "broken on purpose" in capsys.readouterr().err
    # With --no-force-run-failed the failed step is not retried.
    assert cli.main(["run", str(script), "--prefix", prefix, "--no-force-run-failed"]) == 1
    assert "force_run_failed" in capsys.readouterr().err


def test_console_script_is_installed(tmp_path):
    marin = Path(sys.executable).parent / "marin"
    result = subprocess.run([str(marin), "status", "--prefix", str(tmp_path)], capture_output=True, text=True, env=_clean_env())
    assert result.returncode == 0 and "No steps under" in result.stdout


def test_status_and_explain_speak_json_for_scripts(counting, capsys):
    import json

    script, _, prefix = counting
    assert cli.main(["run", str(script), "--prefix", str(prefix), "--", "10"]) == 0
    assert cli.main(["run", str(script), "--prefix", str(prefix), "--", "20"]) == 0
    capsys.readouterr()

    assert cli.main(["status", "--json", "--prefix", str(prefix)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(step["name"] for step in listed) == ["data/rows", "data/rows", "train/model", "train/model"]
    assert all(step["status"] == "SUCCESS" and step["age_s"] >= 0 and len(step["identity"]) == 64 for step in listed)

    assert cli.main(["explain", "train/model", "--json", "--prefix", str(prefix)]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["name"] == "train/model" and tree["hash_attrs"]["lr"] == 0.1 and len(tree["other_outputs"]) == 1
    assert [dep["name"] for dep in tree["deps"]] == ["data/rows"] and "rows" in tree["deps"][0]["hash_attrs"]

    assert cli.main(["explain", "train/model", "train/model", "--json", "--prefix", str(prefix)]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert not diff["same_identity"] and "train/model -> data/rows: hash_attrs.rows changed 10 -> 20" in diff["differences"]


def test_version_is_the_installed_distributions(capsys):
    import importlib.metadata

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"marin {importlib.metadata.version('marin')}"


def test_explain_says_which_dependency_provides_a_null_tokenizer(tmp_path, capsys):
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec
    from marin.experiment.data import tokenized
    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer

    texts = ["Once upon a time, a fox found a ball.", "The bird sang in the sun."] * 4
    (tmp_path / "stories.jsonl").write_text("".join(f'{{"text": "{text}"}}\n' for text in texts))

    def build_tokenizer(output_path):
        save_tokenizer(train_bpe_tokenizer(texts, 280), output_path)
        return {"path": output_path}

    tokenizer_step = StepSpec("tokenizers/tiny", fn=build_tokenizer)
    data = tokenized("tokenized/tiny", source=str(tmp_path / "stories.jsonl"), tokenizer=tokenizer_step)
    assert data.annotations == {"provided_by_dependency": {"tokenize.tokenizer": "tokenizers/tiny"}}
    prefix = tmp_path / "prefix"
    StepRunner(prefix=str(prefix)).run([tokenizer_step, data])
    capsys.readouterr()
    assert cli.main(["explain", "tokenized/tiny", "--prefix", str(prefix)]) == 0
    out = capsys.readouterr().out
    # What was hashed is still shown as it is (null), and where the value comes from beside it.
    assert "    tokenize.tokenizer = null  (the dependency tokenizers/tiny, below)\n" in out
    assert "  dep tokenizers/tiny (" in out
