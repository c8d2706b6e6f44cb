"""The repository's lm-eval task, end to end: a tiny trained model learns it, a random one does not."""

from __future__ import annotations


import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

pytest.importorskip("lm_eval")

from levanter.models.llama import LlamaConfig
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from marin.evaluation.harness import HarnessConfigError, run_harness
from marin.evaluation.model_source import LoadedModel
from marin.evaluation.tasks import TASKS_DIR
from marin.evaluation.tasks.object_colours import colours

TASK = "marin_object_colours"
CONFIG = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=32)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(train_bpe_tokenizer(colours.training_text(), 300), folder)
    return load_tokenizer(folder)


def _train(tokenizer, steps: int):
    """A few dozen Adam steps on sentences that follow the task's rule (other story numbers)."""
    lines = [[tokenizer.eos_id, *tokenizer.tokenizer.encode(text).ids] for text in colours.training_text()]
    width = max(len(line) for line in lines)
    tokens = np.full((len(lines), width), tokenizer.eos_id, np.int32)
    mask = np.zeros((len(lines), width - 1), np.float32)
    for i, line in enumerate(lines):
        tokens[i, :len(line)] = line
        mask[i, :len(line) - 1] = 1.0
    model = CONFIG.build(tokenizer.vocab_size, key=jax.random.PRNGKey(0))
    optimizer = optax.adam(1e-2)
    state = optimizer.init(model)

    def loss_fn(model, batch, batch_mask):
        logits = model(batch[:, :-1])
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
        return jnp.sum(losses * batch_mask) / jnp.sum(batch_mask)

    @jax.jit
    def step(model, state, batch, batch_mask):
        loss, grads = jax.value_and_grad(loss_fn)(model, batch, batch_mask)
        updates, state = optimizer.update(grads, state, model)
        return optax.apply_updates(model, updates), state, loss

    rng = np.random.default_rng(0)
    for _ in range(steps):
        rows = rng.choice(len(lines), 64, replace=False)
        model, state, loss = step(model, state, jnp.asarray(tokens[rows]), jnp.asarray(mask[rows]))
    return model, float(loss)


@pytest.fixture(scope="module")
def trained(tokenizer):
    return _train(tokenizer, steps=80)


def _accuracy(model, tokenizer, label: str):
    results = run_harness(LoadedModel(model, "LlamaLMHeadModel", label), tokenizer, tasks=[TASK], model_label=label,
                          model_identity=label, include_path=TASKS_DIR, batch_size=64, compute_dtype="float32")
    return results


def test_task_data_is_the_rule_and_balanced():
    items = [line for line in open(colours.DATA_FILE, encoding="utf-8") if line.strip()]
    assert len(items) == len(colours.test_items()) == 48
    labels = [item["label"] for item in colours.test_items()]
    assert all(labels.count(i) == 12 for i in range(4))  # a constant answer scores exactly chance
    trained_stories = {text.split(",")[0] for text in colours.training_text()}
    assert not trained_stories & {item["context"].split(",")[0] for item in colours.test_items()}


def test_trained_model_beats_chance_and_random_model_does_not(tokenizer, trained):
    model, final_loss = trained
    learnt = _accuracy(model, tokenizer, "trained")
    random_model = CONFIG.build(tokenizer.vocab_size, key=jax.random.PRNGKey(1))
    chance = _accuracy(random_model, tokenizer, "random")
    print(f"final train loss {final_loss:.3f}\n{learnt.summary()}\n{chance.summary()}")
    assert learnt.samples[TASK] == chance.samples[TASK] == 48
    assert learnt.tasks[TASK]["acc"] >= 0.75
    assert chance.tasks[TASK]["acc"] <= 0.45
    assert 0 <= learnt.tasks[TASK]["acc_stderr"] < 0.2
    assert TASK in learnt.summary() and "acc" in learnt.summary()


@pytest.fixture(scope="module")
def exported(tokenizer, trained, tmp_path_factory):
    from levanter.compat.hf_checkpoints import export_llama_to_hf

    folder = tmp_path_factory.mktemp("hf")
    return export_llama_to_hf(trained[0], folder, tokenizer_dir_or_obj=tokenizer.tokenizer)


def test_harness_step_stores_results_and_is_cached(exported, tmp_path, capsys):
    from marin.evaluation.harness import HarnessResults
    from marin.execution.artifact import load_artifact
    from marin.execution.step_runner import StepRunner
    from marin.experiment.harness import evaluate_harness

    def declare(**overrides):
        args = {"model": exported, "tasks": [TASK], "include_path": TASKS_DIR, "limit": 16, "batch_size": 16,
                "compute_dtype": "float32"} | overrides
        return evaluate_harness("evaluation/harness-colours", **args)

    step = declare()
    assert step.identity == declare(batch_size=4).identity  # batch size changes only the speed
    assert step.identity != declare(limit=8).identity
    runner = StepRunner(prefix=str(tmp_path))
    assert runner.run([step]).ran == ["evaluation/harness-colours"]
    results = load_artifact(runner.output_path_for(step), HarnessResults).result
    assert results.samples == {TASK: 16} and results.limit == 16 and results.model == exported
    assert results.tasks[TASK]["acc"] >= 0.75  # the exported weights are the trained model's
    capsys.readouterr()
    rerun = runner.run([step])
    assert rerun.ran == [] and rerun.cached == ["evaluation/harness-colours"]
    assert TASK in capsys.readouterr().out  # the cached result's summary is printed again

    # New weights (a new checkpoint in the same folder) give a new identity, so the step reruns.
    weights = os.path.join(exported, "model.safetensors")
    original = open(weights, "rb").read()
    try:
        with open(weights, "r+b") as f:
            f.seek(len(original) - 4)
            f.write(b"\x00\x00\x80\x3f")
        assert declare().identity != step.identity
    finally:
        with open(weights, "wb") as f:
            f.write(original)


def test_harness_step_declaration_errors(exported, tmp_path):
    from marin.evaluation.model_source import ModelSourceError
    from marin.experiment.harness import evaluate_harness

    with pytest.raises(HarnessConfigError, match="non-empty list"):
        evaluate_harness("evaluation/bad", model=exported, tasks=TASK)
    with pytest.raises(HarnessConfigError, match="limit"):
        evaluate_harness("evaluation/bad", model=exported, tasks=[TASK], limit=0)
    with pytest.raises(HarnessConfigError, match="not a folder"):
        evaluate_harness("evaluation/bad", model=exported, tasks=[TASK], include_path=tmp_path / "missing")
    with pytest.raises(ModelSourceError, match="no config.json"):
        evaluate_harness("evaluation/bad", model=tmp_path, tasks=[TASK])
