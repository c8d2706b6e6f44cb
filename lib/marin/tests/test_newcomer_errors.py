"""The errors a newcomer meets first: each one says what went wrong, where, and what to do."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import jax
import pytest

from levanter.models.llama import LlamaConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from levanter.tokenization.loading import TokenizerNotFoundError
from levanter.trainer import MeshConfig
from marin import cli
from marin.datasets.sources import SourceUnavailableError
from marin.execution.records.executor_files import read_status
from marin.execution.step_runner import PrefixNotWritableError, StepRunFailed, StepRunner
from marin.execution.step_spec import StepSpec
from marin.experiment.data import tokenized
from marin.experiment.train import TrainConfigError, train_lm

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64)


def _runner_log(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("marin.execution"))


@pytest.fixture(scope="module")
def small_inputs(tmp_path_factory, synthetic_stories):
    """``train.jsonl`` (40 stories) and ``tokenizer/`` (a 300-token BPE trained on them)."""
    root = tmp_path_factory.mktemp("inputs")
    texts = synthetic_stories[:40]
    (root / "train.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(texts, 300), str(root / "tokenizer"))
    return root


# -- data and tokenizer ----------------------------------------------------------------------------


def test_unknown_dataset_id_offline_says_how_to_get_it(monkeypatch, small_inputs):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceUnavailableError) as caught:
        tokenized("tokenized/missing", "nobody-here/no-such-dataset-3141", str(small_inputs / "tokenizer"))
    message = str(caught.value)
    assert "'nobody-here/no-such-dataset-3141' cannot be resolved: HF_HUB_OFFLINE is set" in message
    assert "hf download nobody-here/no-such-dataset-3141 --repo-type dataset" in message
    assert "pass a local file, folder or glob" in message


def test_tokenizer_path_that_does_not_exist(tmp_path, small_inputs):
    missing = str(tmp_path / "no-tokenizer")
    with pytest.raises(TokenizerNotFoundError, match="does not exist. Pass a tokenizer.json file, a folder containing one"):
        tokenized("tokenized/t", str(small_inputs / "train.jsonl"), missing)


def test_tokenizer_hub_id_not_cached_offline(monkeypatch, small_inputs):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerNotFoundError) as caught:
        tokenized("tokenized/t", str(small_inputs / "train.jsonl"), "nobody-here/no-such-tokenizer-3141")
    message = str(caught.value)
    assert "not in the local cache while the hub is disabled (HF_HUB_OFFLINE=1)" in message
    assert "Pass a path to a tokenizer.json or a folder, or download it while online" in message


# -- training ---------------------------------------------------------------------------------------


def test_seq_len_longer_than_the_model_takes_is_refused_when_declared(small_inputs):
    data = tokenized("tokenized/t", str(small_inputs / "train.jsonl"), str(small_inputs / "tokenizer"))
    with pytest.raises(TrainConfigError) as caught:
        train_lm("checkpoints/too-long", model=TINY, datasets={data: 1.0}, batch_size=8, seq_len=128, num_train_steps=1)
    message = str(caught.value)
    assert "seq_len=128 is longer than the model's max_seq_len=64" in message
    assert "Use seq_len <= 64" in message and "dataclasses.replace(model, max_seq_len=128)" in message


def test_batch_size_the_devices_do_not_divide_fails_once_naming_step_and_folder(small_inputs, tmp_path, caplog):
    devices = jax.device_count()
    if devices < 2:
        pytest.skip("needs several (simulated) devices")
    data = tokenized("tokenized/small", str(small_inputs / "train.jsonl"), str(small_inputs / "tokenizer"))
    # data=-1: every device this machine has, a number only the run knows (the CPU's are simulated),
    # so the mismatch is found when the step runs, not when it is declared.
    model = train_lm("checkpoints/odd-batch", model=TINY, datasets={data: 1.0}, batch_size=devices + 1, seq_len=32,
                     num_train_steps=1, num_samples=0, mesh=MeshConfig(data=-1))
    caplog.set_level(logging.INFO)
    with pytest.raises(StepRunFailed) as caught:
        StepRunner(prefix=str(tmp_path)).run([model])
    output = caught.value.report.outcome_of("checkpoints/odd-batch").output_path
    log = _runner_log(caplog)
    expected = f"must split evenly over data x fsdp = {devices} devices; change batch_size"
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "failed (output folder" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].startswith(f"Step checkpoints/odd-batch failed (output folder {output}): TrainerConfigError")
    assert expected in failures[0]
    # A message that says what to do is not buried under a traceback from inside the trainer.
    assert "Traceback" not in log
    assert expected in str(caught.value) and output in str(caught.value)
    assert read_status(output).status == "FAILED"


# -- the prefix -------------------------------------------------------------------------------------


def _noop_step() -> StepSpec:
    return StepSpec(name="preprocess", fn=lambda: None, deps=[], hash_attrs={"param": 42})


def test_prefix_under_a_file_fails_before_any_step(tmp_path, monkeypatch):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MARIN_PREFIX", str(blocker / "outputs"))
    with pytest.raises(PrefixNotWritableError) as caught:
        StepRunner().run([_noop_step()])
    message = str(caught.value)
    assert f"under the prefix {blocker / 'outputs'}, set by the environment variable MARIN_PREFIX" in message
    assert f"{blocker} is a file, so no folder can be made under it" in message
    assert "export MARIN_PREFIX=$HOME/marin-outputs" in message
    with pytest.raises(PrefixNotWritableError, match="is a file"):
        StepRunner().run([_noop_step()], dry_run=True)


def test_prefix_that_is_a_file_through_marin_run(tmp_path, capsys):
    blocker = tmp_path / "prefix-file"
    blocker.write_text("")
    script = tmp_path / "pipeline.py"
    script.write_text(
        "from marin.execution.step_spec import StepSpec\nfrom marin.execution.step_runner import StepRunner\n"
        "StepRunner().run([StepSpec(name='preprocess', fn=lambda: None, deps=[])])\n"
    )
    code = cli.main(["run", str(script), "--prefix", str(blocker)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"marin run: Step outputs cannot be written under the prefix {blocker}, set by the prefix argument" in err
    assert f"{blocker} is a file, not a folder" in err and "Traceback" not in err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permissions do not stop root")
def test_prefix_in_a_read_only_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(PrefixNotWritableError, match="Permission denied"):
            StepRunner(prefix=str(locked / "outputs")).run([_noop_step()])
    finally:
        locked.chmod(0o755)


def test_prefix_the_file_system_refuses_names_the_error(tmp_path, monkeypatch):
    # Root ignores folder permissions, so the refusal is simulated where the runner first writes.
    from marin.execution.planning import prefix_check

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", dir)

    monkeypatch.setattr(prefix_check.tempfile, "TemporaryFile", refuse)
    prefix = tmp_path / "outputs"
    with pytest.raises(PrefixNotWritableError) as caught:
        StepRunner(prefix=str(prefix)).run([_noop_step()])
    assert f"under the prefix {prefix}, set by the prefix argument" in str(caught.value)
    assert f"Permission denied ({prefix})" in str(caught.value)
    assert not (prefix / "preprocess").exists() and list(prefix.iterdir()) == []


# -- a step that raises -----------------------------------------------------------------------------


def _load_corpus(output_path):
    rows = {"text": "only one"}
    return rows["texts"]  # the user's bug


def test_step_that_raises_shows_its_traceback_once_with_step_and_folder(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    step = StepSpec(name="load-corpus", fn=_load_corpus, deps=[])
    report = StepRunner(prefix=str(tmp_path)).run([step], raise_on_failure=False)
    output = report.outcome_of("load-corpus").output_path
    log = _runner_log(caplog)
    assert log.count("Traceback (most recent call last)") == 1
    assert f"Step load-corpus failed (output folder {output}):\nTraceback" in log
    assert 'return rows["texts"]  # the user\'s bug' in log and "KeyError: 'texts'" in log
    # The traceback starts at the user's function, not inside the engine.
    assert "marin/execution/" not in log.split("Traceback (most recent call last)")[1]
    with pytest.raises(StepRunFailed) as caught:
        StepRunner(prefix=str(tmp_path)).run([step])
    assert f"load-corpus ({output}): KeyError: 'texts'" in str(caught.value)
    assert read_status(output).error == "KeyError: 'texts'"


# -- progress lines ---------------------------------------------------------------------------------


def test_progress_lines_show_after_a_library_called_basic_config(tmp_path):
    # absl calls logging.basicConfig() when orbax logs during import; that must not hide the
    # runner's INFO lines in a plain `python script.py` run.
    script = (
        "import logging, sys\n"
        "logging.basicConfig()\n"
        "from marin.execution.step_runner import StepRunner\n"
        "from marin.execution.step_spec import StepSpec\n"
        "StepRunner(prefix=sys.argv[1]).run([StepSpec(name='visible', fn=lambda: None, deps=[])])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MARIN_LOG_LEVEL", "MARIN_PREFIX")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "INFO marin.execution.step_runner: Running 1 step(s)" in done.stderr
    assert "Step visible finished" in done.stderr
    assert "INFO:marin" not in done.stderr  # no second, bare handler repeating each line


def test_jax_no_tpu_notice_is_not_shown_at_info():
    from rigging.log import setup_logging

    root = logging.getLogger()
    saved_level = root.level
    noisy = logging.getLogger("jax._src.xla_bridge")
    try:
        setup_logging("INFO")
        assert not noisy.isEnabledFor(logging.INFO) and noisy.isEnabledFor(logging.WARNING)
        setup_logging("DEBUG")
        assert noisy.isEnabledFor(logging.INFO)
    finally:
        noisy.setLevel(logging.NOTSET)
        root.setLevel(saved_level)


def test_a_marin_error_inside_a_step_shows_its_message_and_the_calling_line(tmp_path, caplog):
    unrelated = StepSpec(name="unrelated", fn=lambda: None, deps=[])

    def read_unrelated(ctx):
        return ctx.load_artifact(unrelated).result

    caplog.set_level(logging.INFO)
    step = StepSpec(name="reader", fn=read_unrelated, deps=[])
    output = StepRunner(prefix=str(tmp_path)).run([step], raise_on_failure=False).outcome_of("reader").output_path
    log = _runner_log(caplog)
    line = read_unrelated.__code__.co_firstlineno + 1
    assert (f"Step reader failed (output folder {output}): InvalidStepError: 'unrelated' is not a dependency of step "
            f"'reader'; add it to the step's deps") in log
    assert f"(in read_unrelated at {__file__}:{line})" in log
    assert "Traceback" not in log
