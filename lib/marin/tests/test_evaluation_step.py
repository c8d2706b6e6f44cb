"""``evaluate_lm()``: an eval step over a trained model, its scores, caching and reruns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.evaluation import EvalConfigError, EvalResults, ModelSourceError, run_evaluation
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.eval import evaluate_lm
from marin.experiment.train import TrainedModel, train_lm
from marin.processing.tokenize import TokenizedDataset, TokenizedSplit

TINY = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64,
                   tie_word_embeddings=True)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("inputs")
    train, validation = synthetic_stories[:100], list(synthetic_stories[300:320])
    for name, texts in (("train", train), ("validation", validation)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(train, 384), str(root / "tokenizer"))
    return root, validation


def _graph(root: Path, steps: int):
    data = tokenized("tokenized/eval-stories", str(root / "train.jsonl"), str(root / "tokenizer"),
                     validation=str(root / "validation.jsonl"))
    model = train_lm(name="checkpoints/eval-tiny", model=TINY, optimizer=AdamConfig(learning_rate=1e-2),
                     datasets={data: 1.0}, batch_size=8, seq_len=64, num_train_steps=steps, num_samples=0)
    return data, model, evaluate_lm("evaluation/eval-tiny", model=model, datasets=[data], batch_size=8)


@pytest.fixture(scope="module")
def first_run(inputs, tmp_path_factory):
    root, texts = inputs
    prefix = str(tmp_path_factory.mktemp("prefix"))
    data, model, evaluation = _graph(root, steps=2)
    report = StepRunner(prefix=prefix).run([evaluation])
    return prefix, data, model, evaluation, report, texts


def test_eval_step_scores_every_validation_token_and_byte(first_run):
    prefix, data, model, evaluation, report, texts = first_run
    assert report.ran == ["tokenized/eval-stories", "checkpoints/eval-tiny", "evaluation/eval-tiny"]
    runner = StepRunner(prefix=prefix)
    results = load_artifact(runner.output_path_for(evaluation), EvalResults).result
    tokenized_data = load_artifact(runner.output_path_for(data), TokenizedDataset).result
    score = results.datasets["tokenized/eval-stories"]
    assert score.split == "validation" and score.documents == len(texts)
    assert score.tokens == tokenized_data.splits["validation"].tokens
    assert score.bytes == sum(len(text.encode("utf-8")) for text in texts)
    assert score.bits_per_byte == pytest.approx(score.loss * score.tokens / math.log(2) / score.bytes)
    assert score.perplexity == pytest.approx(math.exp(score.loss))
    # Same weights and data as the trainer's own validation loss, over slightly different windows.
    trained = load_artifact(runner.output_path_for(model), TrainedModel).result
    assert score.loss == pytest.approx(trained.validation_losses["tokenized/eval-stories"], abs=0.1)
    assert results.model == "checkpoints/eval-tiny" and results.model_identity == model.identity
    assert results.seq_len == 64 and results.vocab_size == 384


def test_rerun_does_nothing_and_prints_the_scores(first_run, capsys):
    prefix, _, _, evaluation, _, _ = first_run
    capsys.readouterr()
    report = StepRunner(prefix=prefix).run([evaluation])
    assert report.ran == [] and report.cached == ["evaluation/eval-tiny"] and len(report.not_needed) == 2
    printed = capsys.readouterr().out
    assert "== evaluation/eval-tiny" in printed and "bits/byte" in printed and "tokenized/eval-stories" in printed


def test_a_new_checkpoint_reruns_the_eval(first_run, inputs):
    prefix, _, _, evaluation, _, _ = first_run
    _, _, longer = _graph(inputs[0], steps=3)
    assert longer.identity != evaluation.identity
    # A dry run asks the runner what it would do without paying for a second training run here.
    plan = StepRunner(prefix=prefix).run([longer], dry_run=True)
    assert plan.would_run == ["checkpoints/eval-tiny", "evaluation/eval-tiny"]
    assert plan.cached == ["tokenized/eval-stories"]


def test_a_checkpoint_folder_scores_like_its_training_step(first_run):
    prefix, data, model, evaluation, _, _ = first_run
    runner = StepRunner(prefix=prefix)
    hf_path = load_artifact(runner.output_path_for(model), TrainedModel).result.hf_path
    by_path = evaluate_lm("evaluation/eval-folder", model=hf_path, datasets={"stories": data}, seq_len=64)
    assert by_path.identity == evaluate_lm("evaluation/eval-folder", model=hf_path, datasets={"stories": data}, seq_len=64).identity
    runner.run([by_path])
    from_folder = load_artifact(runner.output_path_for(by_path), EvalResults).result.datasets["stories"]
    from_step = load_artifact(runner.output_path_for(evaluation), EvalResults).result.datasets["tokenized/eval-stories"]
    assert from_folder.loss == pytest.approx(from_step.loss, rel=1e-6) and from_folder.bytes == from_step.bytes


def test_declaration_errors_say_what_to_do(first_run, tmp_path):
    _, data, model, _, _, _ = first_run
    from marin.execution.lazy import lazy_step

    without_seq_len = lazy_step("checkpoints/other", lambda ctx: None)  # not a train_lm handle: no seq_len to inherit
    with pytest.raises(EvalConfigError, match="pass seq_len="):
        evaluate_lm("evaluation/bad", model=without_seq_len, datasets=[data])
    with pytest.raises(ModelSourceError, match="no config.json"):
        evaluate_lm("evaluation/bad", model=tmp_path, datasets=[data], seq_len=64)
    with pytest.raises(EvalConfigError, match="not a tokenized"):
        evaluate_lm("evaluation/bad", model=model, datasets={"x": "tokenized/eval-stories"})
    # The training mixture itself names the same datasets as a list of its handles.
    assert evaluate_lm("evaluation/x", model=model, datasets={data: 1.0}).identity == \
        evaluate_lm("evaluation/x", model=model, datasets=[data]).identity
    with pytest.raises(EvalConfigError, match="at least one dataset"):
        evaluate_lm("evaluation/bad", model=model, datasets=[])


def test_a_missing_split_is_refused_before_any_work():
    data = TokenizedDataset(splits={"train": TokenizedSplit("unused", 1, 1, 2)}, tokenizer_identity="sha256:x",
                            tokenizer_source="unused", vocab_size=10, eos_id=None, bos_id=None)
    with pytest.raises(EvalConfigError, match="no 'validation' split"):
        run_evaluation(None, {"d": data}, model_label="m", model_identity="i", split="validation", seq_len=8,
                       batch_size=1, compute_dtype="float32")
