"""The training tutorial (experiments/tutorials/train_tiny_model.py) takes its settings from the
command line: ``marin run ... --set train.KEY=VALUE`` moves only the training step's hash, and a
setting for a name the tutorial does not read is refused before any step is planned or run."""

from pathlib import Path

from marin import cli

TUTORIAL = str(Path(__file__).resolve().parents[1] / "experiments" / "tutorials" / "train_tiny_model.py")
# The hashes of the tutorial's own run (docs/getting-started.md), which the defaults must keep.
HASHES = {"datasets/builtin-tinystories": "4781b28e", "tokenizers/builtin-bpe": "9bc6bea9",
          "tokenized/tinystories": "1070fc41", "checkpoints/marin-nano-tinystories": "72472b56"}


def _planned_hashes(out: str) -> dict[str, str]:
    rows = [line.split() for line in out.splitlines() if line.startswith("  to run")]
    return {row[3]: row[2] for row in rows}


def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("MARIN_PREFIX", raising=False)


def test_set_changes_the_training_step_only_and_the_defaults_keep_the_tutorials_hashes(monkeypatch, tmp_path, capsys):
    _offline(monkeypatch, tmp_path)
    prefix = str(tmp_path / "prefix")
    assert cli.main(["run", TUTORIAL, "--dry-run", "--prefix", prefix]) == 0
    assert _planned_hashes(capsys.readouterr().out) == HASHES

    assert cli.main(["run", TUTORIAL, "--dry-run", "--prefix", prefix, "--set", "train.optimizer.learning_rate=6e-3"]) == 0
    changed = _planned_hashes(capsys.readouterr().out)
    assert {name: changed[name] for name in HASHES if name != "checkpoints/marin-nano-tinystories"} == {
        name: value for name, value in HASHES.items() if name != "checkpoints/marin-nano-tinystories"}
    assert changed["checkpoints/marin-nano-tinystories"] != HASHES["checkpoints/marin-nano-tinystories"]


def test_a_setting_the_tutorial_never_reads_is_refused_before_any_step_is_planned(monkeypatch, tmp_path, capsys):
    _offline(monkeypatch, tmp_path)
    prefix = tmp_path / "prefix"
    code = cli.main(["run", TUTORIAL, "--dry-run", "--prefix", str(prefix), "--set", "trian.optimizer.learning_rate=6e-3"])
    captured = capsys.readouterr()
    assert code == 2
    assert "settings were given for trian" in captured.err and "nothing was run" in captured.err
    assert "Dry run" not in captured.out  # refused before the plan, not after the whole script
    assert not prefix.exists()
