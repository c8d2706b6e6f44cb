"""An MoE ``train_lm`` step exports ``hf/`` (Mixtral format), so samples, ``generate``, ``evaluate_lm``
and the model card work on it as on a Llama run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from levanter.inference import SamplingConfig
from levanter.models.moe import MoeConfig
from levanter.optim import AdamConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.evaluation import EvalResults
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.eval import evaluate_lm
from marin.experiment.train import TrainedModel, train_lm
from marin.generate import generate
from marin.reports import write_model_card

TINY_MOE = MoeConfig(hidden_dim=16, intermediate_dim=16, num_layers=2, num_heads=2, num_kv_heads=2, num_experts=4,
                     num_experts_per_token=2, max_seq_len=64)


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("inputs")
    for name, texts in (("train", synthetic_stories[:100]), ("validation", synthetic_stories[300:320])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:100], 384), str(root / "tokenizer"))
    data = tokenized("tokenized/moe-stories", str(root / "train.jsonl"), str(root / "tokenizer"),
                     validation=str(root / "validation.jsonl"))
    model = train_lm(name="checkpoints/moe-tiny", model=TINY_MOE, optimizer=AdamConfig(learning_rate=1e-2),
                     datasets={data: 1.0}, batch_size=8, seq_len=64, num_train_steps=3, num_samples=1)
    evaluation = evaluate_lm("evaluation/moe-tiny", model=model, datasets=[data], batch_size=8)
    prefix = str(tmp_path_factory.mktemp("prefix"))
    report = StepRunner(prefix=prefix).run([evaluation])
    runner = StepRunner(prefix=prefix)
    return report, runner.output_path_for(model), runner.output_path_for(evaluation)


def test_moe_training_writes_a_mixtral_export_with_samples(moe_run, capsys):
    report, train_output, _ = moe_run
    assert report.ran == ["tokenized/moe-stories", "checkpoints/moe-tiny", "evaluation/moe-tiny"]
    trained = load_artifact(train_output, TrainedModel).result
    assert trained.model_type == "MoeConfig" and trained.hf_path is not None
    config = json.loads((Path(trained.hf_path) / "config.json").read_text())
    assert config["model_type"] == "mixtral" and config["num_local_experts"] == 4
    assert (Path(trained.hf_path) / "tokenizer.json").exists()
    assert len(trained.samples) == 1 and trained.samples[0].startswith("Once upon a time")
    summary = trained.summary()
    assert f"HF export:   {trained.hf_path}" in summary and "sample 1:" in summary
    # The family a person knows it by (its export's architecture), and what it was trained with, first.
    assert trained.architecture == "MixtralForCausalLM" and summary.startswith("Trained Mixtral (")
    assert summary.splitlines()[1].startswith(f"  optimizer:   {trained.optimizer['type']}, peak learning rate ")


def test_generate_and_evaluate_lm_read_the_moe_export(moe_run, tmp_path):
    _, train_output, eval_output = moe_run
    texts = generate(train_output, ["Once upon a time"], SamplingConfig(max_new_tokens=4, temperature=0.0))
    assert len(texts) == 1 and texts[0].startswith("Once upon a time") and len(texts[0]) > len("Once upon a time")

    results = load_artifact(eval_output, EvalResults).result
    score = results.datasets["tokenized/moe-stories"]
    trained = load_artifact(train_output, TrainedModel).result
    # The exported MoE scores as the trainer's own validation did (same weights, other windows).
    assert math.isfinite(score.loss) and score.loss == pytest.approx(trained.validation_losses["tokenized/moe-stories"], abs=0.1)

    card = write_model_card(train_output, str(tmp_path / "card"))
    assert card.evaluations == ["evaluation/moe-tiny"]
