"""``train_lm(..., profile=ProfileConfig(...))``: a trace of the chosen steps in the run's folder;
profiling is placement, so it never changes the step's identity."""

from __future__ import annotations

import json
import os

from levanter.models.llama import LlamaConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from levanter.trainer import ProfileConfig
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.train import train_lm

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=64)


def _model(root, **kwargs):
    data = tokenized("tokenized/stories", str(root / "train.jsonl"), str(root / "tokenizer"))
    return train_lm(
        name="checkpoints/profiled", model=TINY, datasets={data: 1.0}, batch_size=8, seq_len=64, num_train_steps=3,
        num_samples=0, **kwargs,
    )


def test_profile_writes_a_trace_of_the_chosen_steps_and_keeps_the_identity(tmp_path, synthetic_stories):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in synthetic_stories[:60]))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:60], 300), str(tmp_path / "tokenizer"))
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    profiled = _model(tmp_path, profile=ProfileConfig(start_step=2, num_steps=1))
    assert runner.output_path_for(profiled) == runner.output_path_for(_model(tmp_path))

    runner.run([profiled])
    profile = os.path.join(runner.output_path_for(profiled), "profile")
    found = [name for _, _, names in os.walk(profile) for name in names]
    assert any(name.endswith(".xplane.pb") for name in found), found
    assert any(name.endswith(".trace.json.gz") for name in found), found
