"""metrics.jsonl after a resume: cut back to the checkpoint step, so each step appears once."""

import json
import logging

from levanter.trainer.tracker import JsonlTracker, read_metrics, truncate_metrics


def _write_killed_run_log(path, last_step=37):
    lines = [json.dumps({"run": "header"})]
    lines += [json.dumps({"step": s, "loss": 10.0 - s / 10}) for s in range(1, last_step + 1)]
    lines.append('{"step": 38, "lo')  # the kill tore the last line
    path.write_text("\n".join(lines))


def test_resume_from_step_30_keeps_each_step_once_and_the_original_values(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_killed_run_log(path)
    tracker = JsonlTracker(str(path), resume_step=30)
    for step in range(31, 41):
        tracker.log(step, {"loss": -float(step)})  # what the resumed run logs
    tracker.close()
    records = read_metrics(str(path))
    assert records[0] == {"run": "header"}  # a record without a step keeps its place
    steps = [r["step"] for r in records[1:]]
    assert steps == list(range(1, 41))
    assert all(r["loss"] == 10.0 - r["step"] / 10 for r in records[1:31])
    assert all(r["loss"] == -float(r["step"]) for r in records[31:])


def test_resume_at_the_last_logged_step_leaves_the_file_untouched(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = "".join(json.dumps({"step": s}) + "\n" for s in range(1, 6))
    path.write_text(text)
    assert truncate_metrics(str(path), 5) == 0
    assert path.read_text() == text


def test_fresh_run_over_an_old_log_starts_it_afresh_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write_killed_run_log(path, last_step=7)
    with caplog.at_level(logging.WARNING, logger="levanter.trainer.tracker.jsonl"):
        tracker = JsonlTracker(str(path))
    tracker.log(1, {"loss": 1.5})
    tracker.close()
    assert read_metrics(str(path)) == [{"step": 1, "loss": 1.5}]
    assert "held 9 record(s) of an earlier attempt" in caplog.text


def test_a_missing_file_is_simply_created(tmp_path):
    path = tmp_path / "sub" / "metrics.jsonl"
    tracker = JsonlTracker(str(path), resume_step=3)
    tracker.log(4, {"loss": 0.5})
    tracker.close()
    assert read_metrics(str(path)) == [{"step": 4, "loss": 0.5}]
