"""Muon, Scion, SOAP and Kron chosen in a YAML settings file (and changed with an override) train
the tutorial's model through ``train_lm``, and name themselves in the step's recorded settings."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from experiments.llama import llama_nano
from levanter.optim import KronConfig, MuonConfig, SOAPConfig, ScionConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.config import apply_overrides, load_config
from marin.experiment.data import tokenized
from marin.experiment.train import TrainedModel, train_lm

# (config class, the YAML of its settings, an override)
CASES = {
    "muon": (MuonConfig, "learning_rate: 0.02\nweight_decay: 0.1\nadam_learning_rate: 3e-3\n", "optimizer.update_scale=adamw_rms"),
    "scion": (ScionConfig, "learning_rate: 3e-4\nweight_decay: 0.1\n", "optimizer.momentum=0.2"),
    "soap": (SOAPConfig, "learning_rate: 3e-3\nprecondition_frequency: 2\n", "optimizer.shampoo_beta=0.9"),
    "kron": (KronConfig, "learning_rate: 3e-3\nweight_decay: 0.1\n", "optimizer.seed=5"),
}
STEPS = 4


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("inputs")
    (root / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in synthetic_stories[:150]))
    (root / "validation.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in synthetic_stories[300:320]))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:150], 512), str(root / "tokenizer"))
    data = tokenized("tokenized/stories", str(root / "train.jsonl"), str(root / "tokenizer"),
                     validation=str(root / "validation.jsonl"))
    return root, data, str(tmp_path_factory.mktemp("prefix"))  # one prefix: the data is tokenized once


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_matrix_optimizer_from_a_yaml_file_trains_the_tutorial_model(name, prepared):
    root, data, prefix = prepared
    cls, yaml_text, override = CASES[name]
    settings_type = dataclasses.make_dataclass("Settings", [("optimizer", cls)])
    path = root / f"{name}.yaml"
    path.write_text("optimizer:\n" + "".join(f"  {line}\n" for line in yaml_text.splitlines()))
    settings = apply_overrides(load_config(settings_type, str(path)), [override])
    optimizer = settings.optimizer
    assert type(optimizer) is cls and optimizer != cls(learning_rate=optimizer.learning_rate)

    step = train_lm(name=f"checkpoints/{name}", model=llama_nano, optimizer=optimizer, datasets={data: 1.0},
                    batch_size=8, seq_len=128, num_train_steps=STEPS, num_samples=0)
    StepRunner(prefix=prefix).run([step])
    out = StepRunner(prefix=prefix).output_path_for(step)
    result = load_artifact(out, TrainedModel).result
    assert result.final_step == STEPS and math.isfinite(result.final_train_loss)
    assert all(math.isfinite(v) for v in result.validation_losses.values())
    losses = [json.loads(line)["loss"] for line in open(result.metrics_path) if '"loss"' in line]
    assert losses[-1] < losses[0], losses
    recorded = json.load(open(f"{out}/.executor_info"))
    # The type and every setting (as JSON has them: Muon's coefficients are a list there).
    assert recorded["hash_attrs"]["optimizer"] == json.loads(json.dumps(optimizer.to_dict()))
    assert type(optimizer).from_dict(recorded["hash_attrs"]["optimizer"]) == optimizer
