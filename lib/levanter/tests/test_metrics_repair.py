"""A damaged metrics.jsonl: a garbage line is dropped with a warning naming the file and line, never
a crash of the reader or of the resume; steps missing before the checkpoint are reported."""

import json
import logging
import os
import shutil

import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.tracker import JsonlTracker, read_metrics, truncate_metrics

LOGGER = "levanter.trainer.tracker.jsonl"
GARBAGE = "\x00\x00\ufffd{not json\n"


def _write(path, steps, *, garbage_at=None, tail=""):
    """One record per step; line ``garbage_at`` (1-based) replaced by bytes a bad disk could leave."""
    lines = [json.dumps({"step": s, "loss": 10.0 - s}) + "\n" for s in steps]
    if garbage_at is not None:
        lines[garbage_at - 1] = GARBAGE
    path.write_text("".join(lines) + tail, encoding="utf-8")


def test_reading_skips_a_garbage_line_and_names_it(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write(path, range(1, 6), garbage_at=3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        records = read_metrics(str(path))
    assert [r["step"] for r in records] == [1, 2, 4, 5]
    assert f"{path} line 3 is not a JSON record" in caplog.text


def test_reading_skips_undecodable_bytes_and_values_that_are_not_records(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n\xff\xfe\x00\n[1, 2]\n{"step": 2}\n')
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read_metrics(str(path)) == [{"step": 1}, {"step": 2}]
    assert f"{path} line 2 is not a JSON record" in caplog.text
    assert f"{path} line 3 is not a JSON record" in caplog.text


def test_a_torn_last_line_is_skipped_quietly(tmp_path, caplog):
    # A kill mid-write, or a writer still at work: not damage, so no warning.
    path = tmp_path / "metrics.jsonl"
    _write(path, range(1, 4), tail='{"step": 4, "lo')
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert [r["step"] for r in read_metrics(str(path))] == [1, 2, 3]
    assert caplog.text == ""


def test_resume_drops_a_garbage_line_with_its_number_and_reports_the_step_it_held(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write(path, range(1, 9), garbage_at=3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        tracker = JsonlTracker(str(path), resume_step=6)
    for step in range(7, 10):
        tracker.log(step, {"loss": 0.5})
    tracker.close()
    assert f"{path} line 3 is not a JSON record" in caplog.text
    assert "step 3 is missing" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert [r["step"] for r in read_metrics(str(path))] == [1, 2, 4, 5, 6, 7, 8, 9]
    assert caplog.text == ""  # the file is clean now


def test_fewer_records_than_the_checkpoint_step_are_reported_as_missing_steps(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write(path, [1, 2, 3, 4, 8])
    before = path.read_text()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert truncate_metrics(str(path), 10) == 0
    assert path.read_text() == before  # nothing to cut: the file is left as it is
    assert "steps 5..7, 9..10 are missing" in caplog.text and "cannot be recovered" in caplog.text


def test_a_missing_file_on_resume_reports_every_step_missing(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        tracker = JsonlTracker(str(path), resume_step=4)
    tracker.log(5, {"loss": 1.0})
    tracker.close()
    assert "steps 1..4 are missing" in caplog.text
    assert read_metrics(str(path)) == [{"step": 5, "loss": 1.0}]


def test_a_complete_log_resumes_without_warnings(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write(path, range(1, 9), tail='{"step": 9, "lo')
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        truncate_metrics(str(path), 6)
    assert caplog.text == ""
    assert [r["step"] for r in read_metrics(str(path))] == list(range(1, 7))


# -- through the trainer ----------------------------------------------------------------------------

VOCAB, SEQ, N = 64, 16, 2


def _train(output_dir, num_train_steps):
    config = TrainerConfig(
        num_train_steps=num_train_steps, batch_size=8, steps_per_checkpoint=N, keep_last_checkpoints=None,
        log_every=2, mesh=MeshConfig(data=1),
    )
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=3)
    model = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
    trainer = Trainer(config, AdamConfig(3e-3, 0.1, warmup=1), output_dir=str(output_dir))
    return trainer.train(lambda key: model.build(VOCAB, key=key), source)


@pytest.fixture(scope="module")
def run_to_2n(tmp_path_factory):
    output = tmp_path_factory.mktemp("run")
    _train(output, 2 * N)
    return output


def test_a_resumed_run_over_a_damaged_log_continues_and_its_log_reads_back(run_to_2n, tmp_path, caplog):
    output = shutil.copytree(run_to_2n, tmp_path / "run")
    metrics = output / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    lines[0] = GARBAGE
    metrics.write_text("".join(lines))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = _train(output, 3 * N)  # resumes from the checkpoint at 2N
    assert result.resumed_from == 2 * N and result.final_step == 3 * N
    assert f"{metrics} line 1 is not a JSON record" in caplog.text and "step 1 is missing" in caplog.text
    assert [r["step"] for r in read_metrics(str(metrics))] == list(range(2, 3 * N + 1))


def test_a_finished_run_rerun_with_a_damaged_log_reports_its_last_loss(run_to_2n, tmp_path):
    output = shutil.copytree(run_to_2n, tmp_path / "run")
    metrics = output / "metrics.jsonl"
    last_loss = read_metrics(str(metrics))[-1]["loss"]
    lines = metrics.read_text().splitlines(keepends=True)
    lines[0] = GARBAGE
    metrics.write_text("".join(lines))
    result = _train(output, 2 * N)  # nothing left to train: the loss comes from the log
    assert result.final_train_loss == last_loss
    assert os.path.exists(metrics)
