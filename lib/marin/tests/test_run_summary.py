"""The run summary names what a person compares runs by first: the model's family and the optimizer with its peak rates."""

from __future__ import annotations

import dataclasses

from levanter.optim import AdamConfig, MuonConfig
from marin.experiment.describe import describe_optimizer, model_family, rates_text
from marin.experiment.train import TrainedModel

RECORD = TrainedModel(
    model_type="LlamaConfig", parameters=651_456, vocab_size=4063, final_step=100, tokens_trained=819_200,
    final_train_loss=2.63, validation_losses={"tokenized/tinystories": 2.71}, train_seconds=81.0,
    output_path="out", checkpoint_dir="out/checkpoints", metrics_path="out/metrics.jsonl", eval_path="out/eval.json",
    hf_path="out/hf", tokenizer="tok", tokenizer_identity="sha256:0", builtin_tokenizer=True,
    optimizer=AdamConfig(learning_rate=6e-3, weight_decay=0.1, warmup=0.05).to_dict(), architecture="LlamaForCausalLM",
)


def test_the_optimizer_and_its_peak_rate_come_right_after_the_headline():
    first, second, *_ = RECORD.summary().splitlines()
    assert first == "Trained Llama (651,456 parameters) for 100 steps, 819,200 tokens, in 81 s."
    assert second == "  optimizer:   adam, peak learning rate 0.006, cosine schedule (warmup 0.05, down to 0x), weight decay 0.1"


def test_the_family_is_the_exports_architecture_not_our_config_class():
    warm_start = dataclasses.replace(RECORD, architecture="Olmo2ForCausalLM", initialized_from="allenai/OLMo-2-0425-1B")
    assert warm_start.summary().startswith("Trained Olmo2 (651,456 parameters)")
    assert model_family("MoeConfig", "MixtralForCausalLM") == "Mixtral"
    # A record made before the architecture was kept (or a run without an export) names its config class.
    assert model_family("LlamaConfig", None) == "Llama"
    old = dataclasses.replace(RECORD, optimizer=None, architecture=None)
    assert old.summary().startswith("Trained Llama (") and "optimizer:" not in old.summary()


def test_an_optimizer_with_several_peak_rates_names_each():
    muon = MuonConfig(learning_rate=2e-2, adam_learning_rate=3e-3).to_dict()
    assert rates_text(muon) == "0.02 (adam_learning_rate 0.003)"
    assert describe_optimizer(muon).startswith("muon, peak learning rate 0.02, adam_learning_rate 0.003, cosine schedule (")
