"""What storing Adam's moments in bfloat16 does to the loss: the same small Llama, tokens and schedule
trained with float32 moments, bfloat16 moments rounded stochastically (``AdamConfig(moment_dtype=
"bfloat16")``) and, as the control, bfloat16 moments rounded to nearest; at ``beta2`` 0.95 (the
default) and 0.999 (where a second moment's change per step is below half a bfloat16 unit). Beside
them, as the scale of what a difference means, float32 moments from other initial weights.

    python bench/moment_dtype_loss.py                 # 400 steps of 8 x 256 tokens per run, eight runs
    python bench/moment_dtype_loss.py --steps 100 --beta2 0.95 --runs "bfloat16 stochastic"

Data: the shared TinyStories sample, as ``bench/optimizer_comparison.py`` reads it (GPT-2 ids that
occur in it, renumbered). Per run: the training loss of every step (the same batches in every run),
the validation loss at the end. Printed against the float32 run of the same ``beta2``: the final
training loss (mean of the last 20 steps), the validation loss, and the largest difference of the
per-step loss and of its 20-step moving average over the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU comparison, whatever accelerator the machine has
sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimizer_comparison import find_sample, load_tokens  # noqa: E402  (one place reads the sample)

from levanter.models.llama import LlamaConfig  # noqa: E402
from levanter.optim import AdamConfig  # noqa: E402
from levanter.optim.narrow_state import stored_in_bfloat16  # noqa: E402

SMALL_LLAMA = LlamaConfig(hidden_dim=128, intermediate_dim=512, num_layers=4, num_heads=4, num_kv_heads=4, max_seq_len=256)
WINDOW = 20  # steps averaged for the final loss and the moving average


@dataclasses.dataclass(frozen=True, kw_only=True)
class NearestRoundedMoments(AdamConfig):
    """AdamW whose moments are stored in bfloat16 rounded to nearest: the control."""

    def build(self, num_train_steps, **kwargs):
        return stored_in_bfloat16(AdamConfig.build(self, num_train_steps, **kwargs), stochastic=False)


def runs(beta2: float) -> dict:
    """name -> (optimizer, seed of the initial weights); "float32" is the reference."""
    shared = dict(learning_rate=3e-3, weight_decay=0.1, warmup=0.05, min_lr_ratio=0.1, beta2=beta2)
    return {
        "float32": (AdamConfig(**shared), 0),
        "float32 other init": (AdamConfig(**shared), 1),
        "bfloat16 stochastic": (AdamConfig(**shared, moment_dtype="bfloat16"), 0),
        "bfloat16 nearest": (NearestRoundedMoments(**shared), 0),
    }


def train(tokens, optimizer, seed: int, steps: int, workdir: str) -> tuple[np.ndarray, float]:
    from levanter.trainer import Trainer, TrainerConfig
    from levanter.trainer.sources import InMemoryWindows

    train_windows = InMemoryWindows(tokens.train, seq_len=256, batch_size=8, seed=0)
    validation = InMemoryWindows(tokens.validation, seq_len=256, batch_size=8)
    config = TrainerConfig(num_train_steps=steps, batch_size=8, log_every=1, checkpoint_at_end=False, seed=seed)
    trainer = Trainer(config, optimizer, output_dir=tempfile.mkdtemp(dir=workdir))
    result = trainer.train(lambda key: SMALL_LLAMA.build(tokens.vocab_size, key=key), train_windows,
                           eval_sources={"validation": validation.sequential_batches})
    losses = np.array([row["loss"] for row in result.history if "loss" in row])
    return losses, result.eval_losses["validation"]


def moving_average(x: np.ndarray) -> np.ndarray:
    return np.convolve(x, np.ones(WINDOW) / WINDOW, mode="valid")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--beta2", type=float, nargs="+", default=[0.95, 0.999])
    p.add_argument("--runs", default=None, help="comma-separated names of runs beside the float32 reference (default: all)")
    p.add_argument("--data", default=None, help="folder holding data/tinystories and tokenizers/gpt2")
    args = p.parse_args(argv)
    chosen = None if args.runs is None else {"float32", *(name.strip() for name in args.runs.split(","))}
    unknown = sorted((chosen or set()) - set(runs(0.95)))
    if unknown:
        raise SystemExit(f"moment_dtype_loss.py: --runs {', '.join(unknown)} unknown; choose from {', '.join(runs(0.95))}")
    root, missing = find_sample(args.data)
    if root is None:
        print(f"moment_dtype_loss.py: skipped: {missing}")
        return 0
    tokens = load_tokens(root, vocab="sample", max_stories=None)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for beta2 in args.beta2:
            done = {name: train(tokens, optimizer, seed, args.steps, workdir)
                    for name, (optimizer, seed) in runs(beta2).items() if chosen is None or name in chosen}
            reference, reference_validation = done["float32"]
            for name, (losses, validation) in done.items():
                row = {"beta2": beta2, "moments": name, "steps": args.steps,
                       "final_train_loss": round(float(losses[-WINDOW:].mean()), 4), "validation_loss": round(validation, 4),
                       "validation_vs_float32": round(validation - reference_validation, 4),
                       "max_step_loss_difference": round(float(np.abs(losses - reference).max()), 4),
                       "max_moving_average_difference": round(float(np.abs(moving_average(losses) - moving_average(reference)).max()), 4)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\nsmall Llama ({SMALL_LLAMA.hidden_dim} wide, {SMALL_LLAMA.num_layers} layers), {args.steps} steps of 8 x 256 tokens, "
          f"vocabulary {tokens.vocab_size:,}; differences against float32 moments at the same beta2:\n")
    print("| beta2 | moments | final train loss | validation loss | validation - float32 | max per-step difference | "
          f"max {WINDOW}-step average difference |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['beta2']} | {r['moments']} | {r['final_train_loss']:.4f} | {r['validation_loss']:.4f} | "
              f"{r['validation_vs_float32']:+.4f} | {r['max_step_loss_difference']:.4f} | {r['max_moving_average_difference']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
