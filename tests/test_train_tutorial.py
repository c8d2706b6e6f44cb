"""The training tutorial (experiments/tutorials/train_tiny_model.py) takes its settings from the
command line: ``marin run ... --set train.KEY=VALUE`` moves only the training step's hash, and a
setting for a name the tutorial does not read is refused before any step is planned or run."""

from pathlib import Path

import pytest

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


def test_the_tutorial_on_a_tpu_pod_plans_the_hash_it_has_on_the_cpu_and_the_pods_mesh(monkeypatch, tmp_path, capsys):
    # The same script with only its resources changed: a v5e slice of 256 chips (64 hosts).
    _offline(monkeypatch, tmp_path)
    source = Path(TUTORIAL).read_text()
    assert source.count("resources=ResourceConfig.with_cpu(),") == 1
    on_a_pod = tmp_path / "train_tiny_model_on_a_pod.py"
    on_a_pod.write_text(source.replace("resources=ResourceConfig.with_cpu(),",
                                       'resources=ResourceConfig.with_tpu("v5litepod-256"),'))
    prefix = str(tmp_path / "prefix")
    # Every chip on fsdp takes a batch of a multiple of 256 rows.
    planned = {}
    for name, script in (("cpu", TUTORIAL), ("pod", str(on_a_pod))):
        assert cli.main(["run", script, "--dry-run", "--prefix", prefix, "--set", "train.batch_size=256"]) == 0
        planned[name] = capsys.readouterr().out
    assert _planned_hashes(planned["cpu"]) == _planned_hashes(planned["pod"])
    training = {name: next(line for line in out.splitlines() if "checkpoints/marin-nano-tinystories" in line)
                for name, out in planned.items()}
    assert training["cpu"].endswith("  mesh 1 device") and training["pod"].endswith("  mesh fsdp=256")
    # The tutorial's own batch of 4 rows cannot split over 256 chips: refused as the step is declared.
    # (marin run reports an error the script raises while declaring its steps in one line, exit 2.)
    assert cli.main(["run", str(on_a_pod), "--dry-run", "--prefix", prefix]) == 2
    refusal = capsys.readouterr().err
    assert "MeshConfigError" in refusal
    assert "batch_size=4 does not split into whole rows over the data x fsdp x experts = 256" in refusal
