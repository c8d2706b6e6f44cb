"""Train the small Llama of the training acceptance check on the shared TinyStories sample.

4 layers, hidden 128, 4 heads, intermediate 512, tied embeddings; GPT-2 tokenizer; seq_len 256,
batch 8; on the local CPU. Everything goes through the framework: the tokenize step (zephyr ->
token cache), the loader (shuffled windows), the trainer, checkpoints and the HF export. Prints the
loss curve (step, tokens, wall time, loss, validation loss) and, as its last line, one JSON object.

    python bench/train_tinystories_small_llama.py [--steps 400] [--prefix /tmp/tinystories-bench]

Needs the shared sample (``../shared/data/tinystories``) and tokenizer (``../shared/tokenizers/gpt2``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.train import train_lm

SHARED = Path(__file__).resolve().parents[2] / "shared"

SMALL_LLAMA = LlamaConfig(
    hidden_dim=128, intermediate_dim=512, num_layers=4, num_heads=4, num_kv_heads=4, max_seq_len=256, tie_word_embeddings=True
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--prefix", default="/tmp/tinystories-bench")
    args = parser.parse_args()

    data = tokenized(
        name="tokenized/tinystories-sample",
        source=str(SHARED / "data/tinystories/train.jsonl"),
        validation=str(SHARED / "data/tinystories/validation.jsonl"),
        tokenizer=str(SHARED / "tokenizers/gpt2/tokenizer.json"),
    )
    model = train_lm(
        name="checkpoints/small-llama-tinystories",
        model=SMALL_LLAMA,
        optimizer=AdamConfig(learning_rate=3e-3, weight_decay=0.1, warmup=0.05, min_lr_ratio=0.1),
        datasets={data: 1.0},
        batch_size=8,
        seq_len=256,
        num_train_steps=args.steps,
        eval_every=50,
        num_samples=1,
    )
    started = time.time()
    StepRunner(prefix=args.prefix).run([model])
    wall = time.time() - started

    out = StepRunner(prefix=args.prefix).output_path_for(model)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    evals = {r["step"]: v for r in rows for k, v in r.items() if k.startswith("eval/") and k.endswith("/loss")}
    print(f"{'step':>5} {'tokens':>9} {'wall_s':>7} {'loss':>7} {'val_loss':>8}")
    for r in rows:
        if "loss" in r and (r["step"] % 25 == 0 or r["step"] in evals):
            val = evals.get(r["step"])
            print(f"{r['step']:>5} {r['tokens']:>9} {r['wall_time']:>7.1f} {r['loss']:>7.3f} {'' if val is None else f'{val:8.3f}'}")
    train_rows = [r for r in rows if "loss" in r]
    print(json.dumps({
        "steps": train_rows[-1]["step"], "tokens": train_rows[-1]["tokens"], "train_wall_s": round(train_rows[-1]["wall_time"], 1),
        "run_wall_s": round(wall, 1), "final_train_loss": round(train_rows[-1]["loss"], 4),
        "final_val_loss": round(evals[max(evals)], 4) if evals else None,
        "tokens_per_second": round(train_rows[-1]["tokens"] / train_rows[-1]["wall_time"], 1),
    }))


if __name__ == "__main__":
    main()
