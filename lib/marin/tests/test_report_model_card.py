"""Model cards from step outputs: content, loss plot, caching of the report step, and `marin report`."""

from __future__ import annotations

import json
import os

import pytest

from marin.cli import main as marin_main
from marin.evaluation import DatasetScore, EvalResults
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.train import DatasetUsed, TrainedModel
from marin.reports import ModelCard, ReportSourceError, model_report, write_model_card

STEPS = 20


def _graph(steps: int = STEPS):
    """A data step, a training step that writes what train_lm writes (without training), an eval step."""
    data = lazy_step("tokenized/card-data", lambda ctx: {"tokens": 1000}, hash_attrs={"source": "stories"})

    def train(ctx) -> TrainedModel:
        with open(os.path.join(ctx.output_path, "metrics.jsonl"), "w") as f:
            for step in range(1, steps + 1):
                f.write(json.dumps({"step": step, "loss": 6.0 - 0.1 * step, "tokens": 64 * step}) + "\n")
                if step % 10 == 0:
                    f.write(json.dumps({"step": step, "eval/card-data/loss": 6.2 - 0.1 * step}) + "\n")
        return TrainedModel(
            model_type="LlamaConfig", parameters=12_345, vocab_size=384, final_step=steps, tokens_trained=64 * steps,
            final_train_loss=6.0 - 0.1 * steps, validation_losses={"card-data": 6.2 - 0.1 * steps}, train_seconds=2.0,
            output_path=ctx.output_path, checkpoint_dir="", metrics_path="", eval_path="", hf_path=None,
            tokenizer="gpt2-like", tokenizer_identity="sha256:" + "0" * 64, builtin_tokenizer=False,
            datasets=[DatasetUsed(name="tokenized/card-data", weight=1.0, source="stories.jsonl", builtin_source=False,
                                  train_tokens=1000, validation_tokens=100)],
        )

    model = lazy_step("checkpoints/card-model", train, deps=[data],
                      hash_attrs={"num_train_steps": steps, "model": {"hidden_dim": 16, "num_layers": 1}, "seq_len": 32, "batch_size": 2})
    score = DatasetScore(loss=4.25, perplexity=70.1, bits_per_byte=3.5, tokens=100, bytes=400, documents=3, split="validation", cache_path="")
    evaluation = lazy_step("evaluation/card-eval", lambda ctx: EvalResults(
        model="checkpoints/card-model", model_identity="x", model_path="", model_type="LlamaLMHeadModel", vocab_size=384,
        seq_len=32, batch_size=2, compute_dtype="float32", eval_seconds=1.0, datasets={"card-data": score}), deps=[model])
    return data, model, evaluation


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("prefix"))
    data, model, evaluation = _graph()
    report = model_report("reports/card-model", model=model, evaluations=[evaluation])
    outcome = StepRunner(prefix=prefix).run([report])
    return prefix, data, model, evaluation, report, outcome


def test_report_step_writes_card_and_plot(first_run):
    prefix, data, model, evaluation, report, outcome = first_run
    assert outcome.ran == ["tokenized/card-data", "checkpoints/card-model", "evaluation/card-eval", "reports/card-model"]
    runner = StepRunner(prefix=prefix)
    card = load_artifact(runner.output_path_for(report), ModelCard).result
    assert card.evaluations == ["evaluation/card-eval"]
    text = open(card.markdown_path, encoding="utf-8").read()
    assert "12,345 parameters" in text and f"trained for {STEPS} steps" in text
    assert "| tokenized/card-data | 1.0 | stories.jsonl | 1,000 | 100 |" in text
    assert "| card-data | 4.2500 | 70.10 | 3.5000 | 100 | 400 |" in text  # the eval step's table
    assert "640 tokens/s" in text  # 1,280 tokens in 2 s
    for step in (data, model, evaluation):  # every step of the DAG, by its hash
        assert f"| {step.name} | `{step.identity[:8]}` |" in text
    assert "![Training and validation loss](loss_curves.png)" in text
    with open(card.plot_path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.dirname(card.plot_path) == os.path.dirname(card.markdown_path)


def test_rerun_does_nothing_and_a_new_checkpoint_reruns_the_report(first_run):
    prefix, _, _, _, report, _ = first_run
    assert StepRunner(prefix=prefix).run([report]).ran == []
    _, longer, longer_eval = _graph(steps=STEPS + 10)
    new_report = model_report("reports/card-model", model=longer, evaluations=[longer_eval])
    assert new_report.identity != report.identity
    plan = StepRunner(prefix=prefix).run([new_report], dry_run=True)
    assert plan.would_run == ["checkpoints/card-model", "evaluation/card-eval", "reports/card-model"]


def test_loss_curves_come_from_metrics(first_run):
    from marin.reports.model_card import collect_card

    prefix, _, model, _, _, _ = first_run
    card = collect_card(StepRunner(prefix=prefix).output_path_for(model))
    assert [step for step, _ in card.train_curve] == list(range(1, STEPS + 1))
    assert card.validation_curves == {"card-data": [(10, pytest.approx(5.2)), (20, pytest.approx(4.2))]}
    assert [name for name, _ in card.evaluations] == ["evaluation/card-eval"]  # found under the prefix


def test_marin_report_command_by_step_name(first_run, tmp_path, capsys):
    prefix, *_ = first_run
    out = tmp_path / "card"
    assert marin_main(["report", "checkpoints/card-model", "--prefix", prefix, "--output", str(out)]) == 0
    assert (out / "MODEL_CARD.md").exists() and (out / "loss_curves.png").exists()
    assert "evaluation/card-eval" in capsys.readouterr().out
    assert marin_main(["report", "checkpoints/no-such-model", "--prefix", prefix]) == 2
    assert "marin status" in capsys.readouterr().err


def test_a_folder_that_is_not_a_training_output_is_refused(first_run, tmp_path):
    prefix, _, _, evaluation, _, _ = first_run
    with pytest.raises(ReportSourceError, match="not of a train_lm step"):
        write_model_card(StepRunner(prefix=prefix).output_path_for(evaluation), str(tmp_path / "x"))
    with pytest.raises(ReportSourceError, match="no step files"):
        write_model_card(str(tmp_path), str(tmp_path / "y"))
