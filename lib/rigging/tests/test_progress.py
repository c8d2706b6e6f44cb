"""Progress bars on a terminal, log lines elsewhere (rigging.progress), and where the project uses them."""

import io
import logging

from rigging.progress import bars_wanted, terminal_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_only_on_a_terminal_unless_the_setting_says_otherwise(monkeypatch):
    monkeypatch.delenv("MARIN_PROGRESS", raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not bars_wanted() and terminal_bar(3, "work") is None
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert bars_wanted()
    monkeypatch.setenv("MARIN_PROGRESS", "0")
    assert not bars_wanted()
    monkeypatch.setenv("MARIN_PROGRESS", "1")
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert bars_wanted()


def test_a_pipeline_on_a_terminal_draws_a_bar_per_stage_instead_of_shard_lines(monkeypatch, caplog):
    from zephyr import Dataset

    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.delenv("MARIN_PROGRESS", raising=False)
    with caplog.at_level(logging.INFO, logger="zephyr"):
        assert Dataset.from_list(list(range(12)), num_shards=4).map(lambda x: x * 2).collect(backend="inline") == \
            [x * 2 for x in range(12)]
    drawn = terminal.getvalue()
    assert "4/4" in drawn and "shard" in drawn
    assert not any("shard 0 done" in r.getMessage() for r in caplog.records)


def test_off_a_terminal_the_stage_log_lines_stay(monkeypatch, caplog):
    from zephyr import Dataset

    monkeypatch.setattr("sys.stderr", io.StringIO())
    monkeypatch.delenv("MARIN_PROGRESS", raising=False)
    with caplog.at_level(logging.INFO, logger="zephyr"):
        Dataset.from_list(list(range(4)), num_shards=2).collect(backend="inline")
    # Off a terminal a stage logs its progress as lines (one when it ends), not a bar.
    assert any("2/2 shards done" in r.getMessage() for r in caplog.records)
