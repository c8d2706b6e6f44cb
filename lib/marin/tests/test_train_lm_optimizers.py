"""Each element-wise optimizer chosen in a YAML settings file (and changed with an override) trains
the tutorial's model through ``train_lm``, and names itself in the step's recorded settings."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from experiments.llama import llama_nano
from levanter.optim import (
    AdamConfig,
    AdamMiniConfig,
    AdoptConfig,
    LionConfig,
    MarsConfig,
    ScheduleFreeAdamConfig,
    SophiaConfig,
)
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.config import apply_overrides, load_config
from marin.experiment.data import tokenized
from marin.experiment.train import TrainedModel, train_lm

# (config class, the YAML of its settings, an override)
CASES = {
    "adopt": (AdoptConfig, "learning_rate: 3e-3\nweight_decay: 0.1\nbeta2: 0.999\n", "optimizer.warmup=2"),
    "mars": (MarsConfig, "learning_rate: 3e-3\nweight_decay: 0.1\n", "optimizer.gamma=0.05"),
    "cautious_adam": (AdamConfig, "learning_rate: 3e-3\ncautious: true\n", "optimizer.beta2=0.99"),
    "cautious_lion": (LionConfig, "learning_rate: 1e-3\nweight_decay: 0.3\ncautious: true\n", "optimizer.warmup=2"),
    "adam_mini": (AdamMiniConfig, "learning_rate: 3e-3\nweight_decay: 0.1\n", "optimizer.beta2=0.99"),
    "sophia": (SophiaConfig, "learning_rate: 3e-3\nupdate_interval: 2\n", "optimizer.gamma=0.02"),
    "schedule_free": (ScheduleFreeAdamConfig, "learning_rate: 3e-3\nwarmup: 2\n", "optimizer.beta1=0.95"),
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
def test_an_optimizer_from_a_yaml_file_trains_the_tutorial_model(name, prepared):
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
    assert recorded["hash_attrs"]["optimizer"] == optimizer.to_dict()  # the type and every setting
