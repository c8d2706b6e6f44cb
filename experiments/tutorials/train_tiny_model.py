"""Train a tiny model end to end: tokenize 1,000 stories, train 100 steps, sample from it.

    source .venv/bin/activate   # once per shell, from the repository root
    marin run experiments/tutorials/train_tiny_model.py
    marin run experiments/tutorials/train_tiny_model.py --set train.optimizer.learning_rate=6e-3
    marin run experiments/tutorials/train_tiny_model.py --set train.optimizer.type=lion

The training settings are read with ``script_config``, so ``marin run --set train.KEY=VALUE`` (or
``--config train=FILE.yaml``) changes them from the command line; the defaults are the tutorial's.
"""

from dataclasses import dataclass, field

from fray.cluster import ResourceConfig
from levanter.optim import AdamConfig, OptimizerConfig
from marin.execution.lazy import lower
from marin.execution.step_runner import StepRunner
from marin.experiment.config import script_config
from marin.experiment.data import tokenized
from marin.experiment.train import train_lm

from experiments.llama import llama_nano
from experiments.marin_tokenizer import marin_tokenizer


@dataclass(frozen=True)
class TrainSettings:
    # Any registered optimizer: a settings file picks one with `optimizer: {type: muon, ...}`.
    optimizer: OptimizerConfig = field(default_factory=lambda: AdamConfig(learning_rate=6e-4, weight_decay=0.1))
    batch_size: int = 4
    seq_len: int = 2048
    num_train_steps: int = 100


train = script_config(TrainSettings, "train")

# Lazy tokenization: nothing is downloaded or tokenized yet.
tinystories_tokenized = tokenized(
    name="tokenized/tinystories",
    source="roneneldan/TinyStories",
    tokenizer=marin_tokenizer,
    sample_count=1000,
)

nano_tinystories_model = train_lm(
    name="checkpoints/marin-nano-tinystories",
    version="v1",
    model=llama_nano,
    optimizer=train.optimizer,
    datasets={tinystories_tokenized: 1.0},
    batch_size=train.batch_size,
    seq_len=train.seq_len,
    num_train_steps=train.num_train_steps,
    resources=ResourceConfig.with_cpu(),
)

if __name__ == "__main__":
    StepRunner().run([lower(nano_tinystories_model)])
