"""``train_lm(evals=...)``: lm-eval tasks run on the live weights during training, without checkpoints."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("lm_eval")

from levanter.compat.hf_checkpoints import import_from_hf
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from marin.evaluation.during_training import metrics_line
from marin.evaluation.harness import HarnessConfigError, HarnessSettings
from marin.evaluation.tasks import TASKS_DIR
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.train import TrainedModel, train_lm
from marin.reports.model_card import collect_card, render_markdown
from marin.serve.runs import CHARTS, chart_series, read_series

TASK = "marin_object_colours"
LIMIT = 8
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=64)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("inputs")
    (root / "train.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in synthetic_stories[:100]))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:100], 400), str(root / "tokenizer"))
    return root


def _train(inputs, **kwargs):
    data = tokenized("tokenized/stories", str(inputs / "train.jsonl"), str(inputs / "tokenizer"))
    return train_lm(name="checkpoints/tiny-harness", model=TINY, optimizer=AdamConfig(learning_rate=3e-3),
                    datasets={data: 1.0}, batch_size=8, seq_len=64, num_train_steps=4, num_samples=0, **kwargs)


@pytest.fixture(scope="module")
def run(inputs, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("prefix"))
    model = _train(inputs, evals=[TASK], eval_harness_every=2, eval_harness_limit=LIMIT)
    StepRunner(prefix=prefix).run([model])
    folders = [os.path.join(prefix, "checkpoints", name) for name in os.listdir(os.path.join(prefix, "checkpoints"))]
    (folder,) = [f for f in folders if f.rsplit("/", 1)[-1].startswith("tiny-harness")]
    return folder


def _harness_lines(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as handle:
        records = [json.loads(line) for line in handle]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("harness/")} for r in records
            if any(k.startswith("harness/") for k in r)}


def test_harness_metrics_are_logged_every_n_steps_and_match_a_separate_run_on_the_final_model(run, inputs):
    lines = _harness_lines(run)
    assert sorted(lines) == [2, 4]
    assert f"harness/{TASK}/acc" in lines[4] and f"harness/{TASK}/acc_norm" in lines[4]
    # The same tasks, run apart on the exported final weights: the same scores (float32 weights both ways).
    model = import_from_hf(os.path.join(run, "hf"))
    separate = HarnessSettings(tasks=(TASK,), include_path=TASKS_DIR, limit=LIMIT).evaluate(
        model, load_tokenizer(str(inputs / "tokenizer")), model_label="final", model_identity="final", model_path="hf")
    expected = {f"harness/{key}": value for key, value in metrics_line(separate).items()}
    assert lines[4] == pytest.approx(expected, abs=1e-6)


def test_evaluation_writes_no_checkpoint_of_its_own(run):
    # The run saves only its final state (minutes_per_checkpoint=10 is never reached in a few seconds).
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["4"]


def test_final_results_are_in_the_artifact_the_model_card_and_the_training_page(run):
    result = load_artifact(run, TrainedModel).result
    final = _harness_lines(run)[4]
    assert result.harness is not None and result.harness.samples == {TASK: LIMIT}
    assert {f"harness/{TASK}/{m}": v for m, v in result.harness.tasks[TASK].items() if "_stderr" not in m} == final
    markdown = render_markdown(collect_card(run))
    assert "(during training, step 4)" in markdown
    assert f"| {TASK} | acc | {final[f'harness/{TASK}/acc']:.4f} |" in markdown
    (pattern,) = [pattern for _, pattern, _ in CHARTS if pattern.startswith("harness/")]
    charted = chart_series(read_series(os.path.join(run, "metrics.jsonl")), pattern)
    assert [step for step, _ in charted[f"{TASK}/acc"]] == [2, 4]


def test_harness_settings_enter_the_identity_only_when_given(inputs):
    plain, evaluated = _train(inputs), _train(inputs, evals=[TASK], eval_harness_every=2)
    assert "harness" not in plain.hash_attrs
    assert evaluated.hash_attrs["harness"]["tasks"] == [TASK] and evaluated.hash_attrs["harness"]["every"] == 2
    assert {k: v for k, v in evaluated.hash_attrs.items() if k != "harness"} == plain.hash_attrs
    assert plain.identity != evaluated.identity


@pytest.mark.parametrize("kwargs", [{"evals": TASK}, {"eval_harness_every": 2}, {"evals": [TASK], "eval_harness_every": 0}])
def test_impossible_harness_settings_fail_when_declared(inputs, kwargs):
    with pytest.raises(HarnessConfigError):
        _train(inputs, **kwargs)
