"""Each optimizer chosen by name in a YAML settings file (``optimizer: {type: ...}``, then changed with
an override) trains the tutorial's model through ``train_lm``, and names itself in the step's recorded
settings."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from experiments.llama import llama_nano
from levanter.optim import OptimizerConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.config import apply_overrides, load_config
from marin.experiment.data import tokenized
from marin.experiment.train import TrainedModel, train_lm

# (the YAML of its settings, an override), by the name the settings file gives it
CASES = {
    "adam": ("learning_rate: 3e-3\ncautious: true\n", "optimizer.beta2=0.99"),
    "adam_mini": ("learning_rate: 3e-3\nweight_decay: 0.1\n", "optimizer.beta2=0.99"),
    "adopt": ("learning_rate: 3e-3\nweight_decay: 0.1\nbeta2: 0.999\n", "optimizer.warmup=2"),
    # The vocabulary side of the head and embedding is kept diagonal (their full factors would be 512 x 512).
    "kron": ("learning_rate: 3e-3\nweight_decay: 0.1\nmax_size_triangular: 256\n", "optimizer.seed=5"),
    "lion": ("learning_rate: 1e-3\nweight_decay: 0.3\ncautious: true\n", "optimizer.warmup=2"),
    "mars": ("learning_rate: 3e-3\nweight_decay: 0.1\n", "optimizer.gamma=0.05"),
    "muon": ("learning_rate: 0.02\nweight_decay: 0.1\nadam_learning_rate: 3e-3\n", "optimizer.update_scale=adamw_rms"),
    "schedule_free_adam": ("learning_rate: 3e-3\nwarmup: 2\n", "optimizer.beta1=0.95"),
    "scion": ("learning_rate: 3e-4\nweight_decay: 0.1\n", "optimizer.momentum=0.2"),
    "soap": ("learning_rate: 3e-3\nprecondition_frequency: 2\nmax_precond_dim: 256\n", "optimizer.shampoo_beta=0.9"),
    "sophia": ("learning_rate: 3e-3\nupdate_interval: 2\n", "optimizer.gamma=0.02"),
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


@dataclasses.dataclass(frozen=True)
class Settings:
    optimizer: OptimizerConfig


def test_every_registered_optimizer_has_a_case():
    assert set(CASES) == set(OptimizerConfig.registered())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_optimizer_from_a_yaml_file_trains_the_tutorial_model(name, prepared):
    root, data, prefix = prepared
    yaml_text, override = CASES[name]
    path = root / f"{name}.yaml"
    path.write_text(f"optimizer:\n  type: {name}\n" + "".join(f"  {line}\n" for line in yaml_text.splitlines()))
    optimizer = apply_overrides(load_config(Settings, str(path)), [override]).optimizer
    cls = OptimizerConfig.registered()[name]
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
    assert OptimizerConfig.from_dict(recorded["hash_attrs"]["optimizer"]) == optimizer
