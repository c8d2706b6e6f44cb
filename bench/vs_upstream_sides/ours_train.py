"""Our side of the training comparison: our Llama through our own ``levanter.trainer.Trainer``.

The same seeded random tokens as upstream's side, AdamW with global-norm clipping at 1.0, a constant
learning rate and no warm-up, f32 compute, no checkpoints. Our Llama's defaults are unrolled layers
with no rematerialisation, so ``--layout unrolled`` and ``--layout defaults`` run the same model;
the flag is there so both sides take the same arguments.

Prints one JSON line: parameters, the time from building the state to the end of the first step
(initialisation, compilation and one step), and steady-state tokens/s over the steps after warm-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time

import equinox as eqx
import jax
import numpy as np

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab", "seq-len", "batch", "steps", "warmup-steps"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--tied", action="store_true")
    parser.add_argument("--layout", choices=("unrolled", "defaults"), required=True)
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.WARNING)

    total = args.warmup_steps + args.steps
    model_config = LlamaConfig(hidden_dim=args.hidden, intermediate_dim=args.intermediate, num_layers=args.layers,
                               num_heads=args.heads, num_kv_heads=args.kv_heads, max_seq_len=args.seq_len,
                               tie_word_embeddings=args.tied)
    trainer_config = TrainerConfig(num_train_steps=total, batch_size=args.batch, log_every=total, mesh=MeshConfig(data=1),
                                   checkpoint_at_end=False, compute_dtype="float32")
    optimizer = AdamConfig(3e-4, 0.1, beta1=0.9, beta2=0.95, epsilon=1e-8, max_grad_norm=1.0,
                           lr_schedule="constant", warmup=0.0)
    tokens = np.random.default_rng(0).integers(0, args.vocab, size=(total * args.batch, args.seq_len)).astype(np.int32)
    source = InMemoryWindows(tokens, seq_len=args.seq_len, batch_size=args.batch)

    marks: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ours-train-") as out:
        trainer = Trainer(trainer_config, optimizer, output_dir=out,
                          hooks=[lambda _trainer, _step, _metrics: marks.append(time.perf_counter())])
        started = time.perf_counter()
        result = trainer.train(lambda key: model_config.build(args.vocab, key=key), source)
    parameters = sum(leaf.size for leaf in jax.tree.leaves(eqx.filter(result.model, eqx.is_inexact_array)))
    steady = marks[-1] - marks[args.warmup_steps - 1]
    print(json.dumps({"parameters": int(parameters), "first_step_s": round(marks[0] - started, 3),
                      "steps": args.steps, "tokens_per_s": round(args.steps * args.batch * args.seq_len / steady, 1),
                      "layout": args.layout, "scan_layers": model_config.use_scan, "remat": model_config.remat}))


if __name__ == "__main__":
    main()
