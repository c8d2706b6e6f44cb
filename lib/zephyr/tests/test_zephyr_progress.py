"""Progress lines of a pipeline stage without a terminal bar: one line when a stage ends (not one
per shard), and periodic lines before that only for a stage that runs longer than the interval."""

import logging
import sys

from zephyr import Dataset


def _progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "zephyr" and "shards" in r.getMessage()]


def test_a_short_stage_logs_one_progress_line_not_one_per_shard(monkeypatch, caplog):
    monkeypatch.setenv("MARIN_PROGRESS", "0")
    caplog.set_level(logging.INFO, logger="zephyr")
    assert Dataset.from_list(range(12), num_shards=6).map(lambda x: x + 1).collect(backend="inline") == list(range(1, 13))
    lines = _progress_lines(caplog)
    assert len(lines) == 1, lines
    assert "6/6 shards done, 12 items" in lines[0]


def test_a_stage_longer_than_the_interval_also_logs_along_the_way(monkeypatch, caplog):
    monkeypatch.setenv("MARIN_PROGRESS", "0")
    monkeypatch.setattr(sys.modules["zephyr.execute"], "PROGRESS_LOG_INTERVAL_S", 0.0)  # every shard is past the interval
    caplog.set_level(logging.INFO, logger="zephyr")
    Dataset.from_list(range(12), num_shards=4).collect(backend="inline")
    lines = _progress_lines(caplog)
    assert [line.split(": ", 1)[1].split(",")[0] for line in lines] == ["1/4 shards", "2/4 shards", "3/4 shards",
                                                                       "4/4 shards done"]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]
