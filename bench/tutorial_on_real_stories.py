"""The offline tutorial model scored on the corpus it was trained on and on real TinyStories stories.

    python bench/tutorial_on_real_stories.py              # both learning rates of docs/getting-started.md
    python bench/tutorial_on_real_stories.py --prefix /tmp/real   # keep the outputs there (a rerun is cached)

Offline, the tutorial trains and validates on the built-in generated corpus, so its validation loss
says how well the model learnt the generator. This declares the tutorial's training step (the same
identity as ``experiments/tutorials/train_tiny_model.py``'s) at the default learning rate, 6e-4,
and at 6e-3, and an ``evaluate_lm`` step for each that scores the generated validation stories
and the validation stories of the real TinyStories sample, tokenized with the same built-in
tokenizer. It prints each evaluation's summary: the figures in docs/getting-started.md.

Data: the shared TinyStories sample (``data/tinystories/{train,validation}.jsonl`` under
``MARIN_TEST_DATA``, else ``shared/`` beside the checkout, else ``~/.cache/marin/test-data``).
Without it the script prints why and exits 0. Two 100-step trainings: a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimizer_comparison import REPO, find_sample  # noqa: E402  (one place knows where the sample lives)

LEARNING_RATES = (6e-4, 6e-3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", help="where the outputs go (default: a new temporary folder, kept)")
    parser.add_argument("--data", help="the folder holding data/tinystories (default: where the tests look)")
    args = parser.parse_args()
    root, missing = find_sample(args.data)
    if root is None:
        print(f"tutorial_on_real_stories: skipped, {missing}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tutorial's offline defaults, as the docs measured them
    os.environ["MARIN_PREFIX"] = args.prefix or tempfile.mkdtemp(prefix="marin-real-stories-")
    sys.path.insert(0, str(REPO))

    from fray.cluster import ResourceConfig
    from levanter.optim import AdamConfig
    from marin.execution.step_runner import StepRunner
    from marin.experiment.data import tokenized
    from marin.experiment.eval import evaluate_lm
    from marin.experiment.train import train_lm

    from experiments.llama import llama_nano
    from experiments.marin_tokenizer import marin_tokenizer

    stories = root / "data" / "tinystories"
    generated = tokenized(name="tokenized/tinystories", source="roneneldan/TinyStories", tokenizer=marin_tokenizer,
                          sample_count=1000)
    real = tokenized(name="tokenized/real-tinystories", source=str(stories / "train.jsonl"),
                     validation=str(stories / "validation.jsonl"), tokenizer=marin_tokenizer)
    evaluations = []
    for learning_rate in LEARNING_RATES:
        model = train_lm(name="checkpoints/marin-nano-tinystories", version="v1", model=llama_nano,
                         optimizer=AdamConfig(learning_rate=learning_rate, weight_decay=0.1), datasets={generated: 1.0},
                         batch_size=4, seq_len=2048, num_train_steps=100, resources=ResourceConfig.with_cpu())
        evaluations.append(evaluate_lm(name=f"evaluation/generated-and-real-{learning_rate:g}", model=model,
                                       datasets={"generated": generated, "real": real}, batch_size=4))
    report = StepRunner().run(evaluations)
    for learning_rate, evaluation in zip(LEARNING_RATES, evaluations):
        print(f"\nlearning_rate={learning_rate:g}: {report.outcome_of(evaluation.name).result.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
