"""Declaring sweeps: grids, labels, IsoFLOP points from a budget, annotations outside the identity, the dry run's compute."""

from __future__ import annotations

import json

import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.sweep import (
    SweepError,
    budget_label,
    grid,
    isoflop_grid,
    isoflop_sweep,
    setting_label,
    train_sweep,
)
from marin.experiment.train import train_lm

VOCAB = 512
SEQ_LEN = 64
BATCH = 4


def _llama(width: int) -> LlamaConfig:
    return LlamaConfig(hidden_dim=width, intermediate_dim=4 * width, num_layers=2, num_heads=2, num_kv_heads=2,
                       max_seq_len=SEQ_LEN, tie_word_embeddings=False)


MODELS = {f"w{w}": _llama(w) for w in (16, 32, 48, 64)}


@pytest.fixture(scope="module")
def data(tmp_path_factory, synthetic_stories):
    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer

    root = tmp_path_factory.mktemp("sweep-inputs")
    (root / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in synthetic_stories[:50]))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:50], VOCAB), str(root / "tokenizer"))
    return tokenized("tokenized/sweep-stories", str(root / "train.jsonl"), str(root / "tokenizer"))


def test_a_grid_is_every_combination_with_the_last_axis_fastest():
    assert grid(lr=[1e-3, 3e-3], model=["a", "b"]) == [
        {"lr": 1e-3, "model": "a"}, {"lr": 1e-3, "model": "b"}, {"lr": 3e-3, "model": "a"}, {"lr": 3e-3, "model": "b"},
    ]
    with pytest.raises(SweepError, match="axis 'lr' must be a non-empty list"):
        grid(lr=[])
    with pytest.raises(SweepError, match="axis 'model' must be a non-empty list"):
        grid(model="w16")


def test_labels_are_folder_safe_and_objects_need_names():
    assert setting_label({"learning_rate": 3e-3, "model": "w64"}) == "learning_rate-0.003_model-w64"
    assert setting_label({"budget": 1e13}) == "budget-1e13"
    assert setting_label({"label": "baseline", "learning_rate": 1e-3}) == "baseline"
    with pytest.raises(SweepError, match="no short name"):
        setting_label({"model": _llama(16)})
    with pytest.raises(SweepError, match="unsafe in folder names"):
        setting_label({"label": "a b"})
    assert [budget_label(b) for b in (1e13, 3e12, 2.5e12, 1.234e15)] == ["1e13", "3e12", "2.5e12", "1.23e15"]


def test_a_train_sweep_names_each_point_and_keeps_its_setting_outside_the_identity(data):
    optimizer = AdamConfig(learning_rate=1e-3)
    # Optimizer changes have no short label of their own: such settings are labelled by the caller.
    settings = [{"label": f"{m}-lr{lr:g}", "model": m, "optimizer": {"learning_rate": lr}}
                for m in ("w16", "w32") for lr in (1e-3, 3e-3)]
    steps = train_sweep("sweeps/lr", settings, models=MODELS, vocab_size=VOCAB, datasets={data: 1.0},
                        batch_size=BATCH, seq_len=SEQ_LEN, num_train_steps=5, optimizer=optimizer, num_samples=0)
    assert [s.name for s in steps] == ["sweeps/lr/w16-lr0.001", "sweeps/lr/w16-lr0.003", "sweeps/lr/w32-lr0.001",
                                       "sweeps/lr/w32-lr0.003"]
    assert len({s.identity for s in steps}) == 4
    # The same run declared alone has the same identity: a sweep point is an ordinary train_lm step.
    alone = train_lm("sweeps/lr/w32-lr0.003", model=MODELS["w32"], optimizer=AdamConfig(learning_rate=3e-3),
                     datasets={data: 1.0}, batch_size=BATCH, seq_len=SEQ_LEN, num_train_steps=5, num_samples=0)
    assert alone.identity == steps[3].identity
    assert steps[3].annotations["sweep"]["setting"] == {"label": "w32-lr0.003", "model": "w32",
                                                       "optimizer": {"learning_rate": 3e-3}}
    expected = MODELS["w32"].flops_per_token(VOCAB, SEQ_LEN) * BATCH * SEQ_LEN * 5
    assert steps[3].annotations["flops"] == pytest.approx(expected)
    with pytest.raises(SweepError, match="two settings labelled 'x'"):
        train_sweep("sweeps/dup", [{"label": "x", "model": "w16"}, {"label": "x", "model": "w32"}], models=MODELS,
                    datasets={data: 1.0}, batch_size=BATCH, seq_len=SEQ_LEN, num_train_steps=5)
    with pytest.raises(SweepError, match="names the model 'w999'"):
        train_sweep("sweeps/bad", [{"model": "w999"}], models=MODELS, datasets={data: 1.0}, batch_size=BATCH,
                    seq_len=SEQ_LEN, num_train_steps=5)


def test_isoflop_points_spend_their_budget_to_within_half_a_step():
    points = isoflop_grid([2e9, 2e10], MODELS, vocab_size=VOCAB, batch_size=BATCH, seq_len=SEQ_LEN, min_steps=3)
    assert {(p.budget, p.model_label) for p in points} >= {(2e10, label) for label in MODELS}
    for point in points:
        model = MODELS[point.model_label]
        per_step = model.flops_per_token(VOCAB, SEQ_LEN) * BATCH * SEQ_LEN
        assert point.num_train_steps == round(point.budget / per_step) >= 3
        assert point.tokens == point.num_train_steps * BATCH * SEQ_LEN
        assert abs(point.flops - point.budget) <= per_step / 2
        assert point.params == model.num_parameters(VOCAB)
    # A bigger budget trains each model on more tokens; at one budget a bigger model sees fewer.
    by = {(p.budget, p.model_label): p for p in points}
    assert by[(2e10, "w16")].tokens > by[(2e9, "w16")].tokens
    assert by[(2e10, "w16")].tokens > by[(2e10, "w64")].tokens


def test_a_budget_too_small_for_three_models_is_refused_with_what_to_change():
    with pytest.raises(SweepError) as refused:
        isoflop_grid([1e8], MODELS, vocab_size=VOCAB, batch_size=BATCH, seq_len=SEQ_LEN, min_steps=10)
    message = str(refused.value)
    assert "1e+08 FLOPs leaves 0 model(s)" in message and "w64 (" in message and "min_steps" in message
    # Too many tokens for the data: the smallest models of a large budget are left out, and named.
    kept = isoflop_grid([2e10], MODELS, vocab_size=VOCAB, batch_size=BATCH, seq_len=SEQ_LEN, min_steps=3, max_tokens=100_000)
    assert "w16" not in {p.model_label for p in kept} and all(p.tokens <= 100_000 for p in kept)
    with pytest.raises(SweepError, match=r"at most 20,000 tokens .*w16 \([\d,]+ tokens\)"):
        isoflop_grid([2e10], MODELS, vocab_size=VOCAB, batch_size=BATCH, seq_len=SEQ_LEN, min_steps=3, max_tokens=20_000)


def test_isoflop_steps_are_named_by_budget_and_model_and_the_dry_run_adds_up_their_compute(data, tmp_path, capsys):
    steps = isoflop_sweep("sweeps/iso", budgets=[2e9, 2e10], models=MODELS, vocab_size=VOCAB, batch_size=BATCH,
                          seq_len=SEQ_LEN, min_steps=3, datasets={data: 1.0}, num_samples=0)
    names = [s.name for s in steps]
    assert "sweeps/iso/2e10/w64" in names and all(n.startswith(("sweeps/iso/2e9/", "sweeps/iso/2e10/")) for n in names)
    sweep = steps[-1].annotations["sweep"]
    assert sweep["kind"] == "isoflop" and sweep["budget"] == 2e10 and sweep["model"] in MODELS
    total = sum(s.annotations["flops"] for s in steps)

    report = StepRunner(prefix=str(tmp_path / "prefix")).run(steps, dry_run=True)
    out = capsys.readouterr().out
    assert report.dry_run and not (tmp_path / "prefix").exists()
    line = next(line for line in out.splitlines() if "sweeps/iso/2e10/w64" in line)
    assert "FLOPs" in line and f"N {MODELS['w64'].num_parameters(VOCAB):.2g}" in line
    assert f"Planned compute: {total:.3g} FLOPs over {len(steps)} step(s) that declare it; {total:.3g} of it still to run." in out
