"""On a terminal, training and evaluation draw progress bars in place of their progress lines."""

import io
import json
import logging

import numpy as np

from levanter.main.train_lm import TrainLmConfig, train_lm
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import TrainerConfig
from levanter.trainer.sources import InMemoryWindows

TINY = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=16)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_training_on_a_terminal_draws_a_step_bar_and_writes_the_same_metrics(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("MARIN_PROGRESS", raising=False)

    def run(name: str, stderr) -> list[dict]:
        monkeypatch.setattr("sys.stderr", stderr)
        config = TrainLmConfig(model=TINY, optimizer=AdamConfig(learning_rate=1e-2), vocab_size=32,
                               trainer=TrainerConfig(num_train_steps=3, batch_size=8, log_every=1),
                               output_path=str(tmp_path / name))
        source = InMemoryWindows(np.tile(np.arange(32), 32), seq_len=16, batch_size=8, seed=0)
        result = train_lm(config, source)
        return [json.loads(line) for line in open(result.metrics_path) if '"loss"' in line]

    with caplog.at_level(logging.INFO, logger="levanter.trainer"):
        terminal = _Terminal()
        drawn = run("terminal", terminal)
        console_lines = [r for r in caplog.records if r.getMessage().startswith("step ") and "/3" in r.getMessage()]
    assert "training" in terminal.getvalue() and "3/3" in terminal.getvalue()
    assert console_lines == []  # the bar took their place
    logged = run("file", io.StringIO())
    assert [m["loss"] for m in drawn] == [m["loss"] for m in logged]  # the bar changes what is shown, not what is computed
