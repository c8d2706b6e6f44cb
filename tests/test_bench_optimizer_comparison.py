"""bench/optimizer_comparison.py keeps running: its tiny setting trains, evaluates and tabulates end to end."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import optimizer_comparison  # noqa: E402


def test_tiny_comparison_sweeps_each_optimizer_and_prints_the_table(real_data, tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    assert optimizer_comparison.main(["--tiny", "--data", str(real_data.root), "--out", str(out)]) == 0

    printed = capsys.readouterr().out
    assert "| optimizer | best lr | val loss | val loss at the other rates | tokens/s | state | x AdamW |" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["optimizer"] for row in rows] == ["AdamW", "Lion"]
    for row in rows:
        assert f"| {row['optimizer']} | " in printed
        assert [run["error"] for run in row["runs"]] == [None, None]
        losses = {run["learning_rate"]: run["validation_loss"] for run in row["runs"]}
        assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses.values())
        assert row["validation_loss"] == min(losses.values()) == losses[row["best_lr"]]
        # A few steps from a random start: near the uniform guess's loss, ln(vocabulary), not beyond it.
        assert row["validation_loss"] < math.log(row["vocab_size"]) + 0.1
        assert row["tokens_per_second"] > 0
    # Lion keeps one moment per parameter where AdamW keeps two; step counters add a few bytes.
    assert rows[0]["state_vs_adamw"] == 1.0
    assert rows[1]["state_vs_adamw"] == pytest.approx(0.5, abs=1e-3)


def test_without_the_sample_it_says_what_is_missing_and_succeeds(tmp_path, capsys):
    assert optimizer_comparison.main(["--tiny", "--data", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip()
    assert "\n" not in printed
    assert "skipped" in printed and "data/tinystories/train.jsonl" in printed and str(tmp_path) in printed
