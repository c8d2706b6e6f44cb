"""``train_lm()`` under an object-store prefix (``memory://``, and ``s3://`` on the S3 test server):
checkpoints, metrics, ``eval.json`` and the Hugging Face export land in the bucket, and a rerun is
cached from there. The run's working directory stays empty: no URL becomes a local folder."""

from __future__ import annotations

import json
import uuid

import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from levanter.trainer.tracker import read_metrics
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.train import TrainedModel, train_lm
from rigging import filesystem as fsx

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64)
STEPS = 4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("inputs")
    for name, texts in (("train", synthetic_stories[:60]), ("validation", synthetic_stories[300:310])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:60], 384), str(root / "tokenizer"))
    return root


@pytest.fixture(params=["memory", "s3"])
def prefix(request, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    if request.param == "memory":
        url = f"memory://train-object-store-{uuid.uuid4().hex[:12]}"
    else:
        url = request.getfixturevalue("s3_prefix")
    yield url
    assert not list(cwd.iterdir()), f"a URL was written as a local path: {sorted(p.name for p in cwd.iterdir())}"


def test_training_under_an_object_store_prefix_writes_its_whole_output_there(inputs, prefix):
    data = tokenized("tokenized/stories", str(inputs / "train.jsonl"), str(inputs / "tokenizer"),
                     validation=str(inputs / "validation.jsonl"))
    model = train_lm(
        name="checkpoints/tiny", model=TINY, optimizer=AdamConfig(learning_rate=3e-3), datasets={data: 1.0},
        batch_size=8, seq_len=64, num_train_steps=STEPS, steps_per_checkpoint=2, num_samples=1,
    )
    runner = StepRunner(prefix=prefix)
    report = runner.run([model])
    assert set(report.ran) == {"tokenized/stories", "checkpoints/tiny"}

    out = runner.output_path_for(model)
    assert out.startswith(prefix)
    result = load_artifact(out, TrainedModel).result
    assert result.final_step == STEPS
    assert result.checkpoint_dir == fsx.join(out, "checkpoints") and result.hf_path == fsx.join(out, "hf")
    stored = set(fsx.find_files(out))
    assert {f"checkpoints/{STEPS}/state/_METADATA", "metrics.jsonl", "eval.json", "hf/config.json",
            "hf/model.safetensors", "hf/tokenizer.json"} <= stored
    assert [r["step"] for r in read_metrics(result.metrics_path) if "loss" in r] == list(range(1, STEPS + 1))
    assert json.loads(fsx.read_text(result.eval_path))["step"] == STEPS
    assert len(result.samples) == 1 and result.samples[0].startswith("Once upon a time")

    again = StepRunner(prefix=prefix).run([model])
    assert not again.ran and again.cached == ["checkpoints/tiny"] and again.not_needed == ["tokenized/stories"]
