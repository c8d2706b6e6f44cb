"""Model-FLOPs utilisation of a ~1B Llama training on one accelerator, through the real Trainer.

    python bench/mfu.py                 # ~1.4B Llama (experiments.llama.llama_1_4b), bf16 compute
    python bench/mfu.py --tiny          # a tiny model on CPU: a smoke check (MFU is null on CPU)

MFU = flops_per_token(model, seq_len) x tokens/s / (peak bf16 FLOP/s x devices); the FLOPs count
is the 6N + attention formula of ``LlamaConfig.flops_per_token`` and the peak comes from
``levanter.trainer.hardware``. Timed over the steps after the warm-up ones (compilation). The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--microbatch", type=int, default=None)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.tiny:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("absl").setLevel(logging.WARNING)
    import jax

    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, Trainer, TrainerConfig, peak_flops_per_device
    from levanter.trainer.sources import InMemoryWindows

    if args.tiny:
        model = LlamaConfig(hidden_dim=64, intermediate_dim=256, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=128)
        vocab, batch, seq_len, steps = args.vocab or 512, args.batch or 4, args.seq_len or 128, args.steps or 5
    else:
        from experiments.llama import LLAMA3_VOCAB_SIZE, llama_1_4b

        model = dataclasses.replace(llama_1_4b, use_scan=True, gradient_checkpointing=args.gradient_checkpointing)
        vocab, batch, seq_len, steps = args.vocab or LLAMA3_VOCAB_SIZE, args.batch or 8, args.seq_len or 2048, args.steps or 20
    model = dataclasses.replace(model, max_seq_len=max(model.max_seq_len, seq_len))

    total = steps + args.warmup_steps
    config = TrainerConfig(
        num_train_steps=total, batch_size=batch, microbatch_size=args.microbatch, log_every=5,
        mesh=MeshConfig(data=1), checkpoint_at_end=False,
    )
    rng = np.random.default_rng(0)
    source = InMemoryWindows(rng.integers(0, vocab, size=(total + 1) * batch * seq_len), seq_len=seq_len, batch_size=batch)
    flops_per_token = model.flops_per_token(vocab, seq_len)
    device = jax.devices()[0]
    print(
        f"{device.device_kind}: {model.num_parameters(vocab) / 1e9:.2f}B params, batch {batch} x {seq_len}, "
        f"{flops_per_token / 1e9:.2f} GFLOP/token", file=sys.stderr,
    )
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(config, AdamConfig(3e-4, 0.1, warmup=2), output_dir=out, flops_per_token=flops_per_token)
        result = trainer.train(lambda key: model.build(vocab, key=key), source)
    rows = [r for r in result.history if "loss" in r]
    t0, t1 = rows[args.warmup_steps - 1]["wall_time"], rows[-1]["wall_time"]
    tokens_per_s = steps * batch * seq_len / (t1 - t0)
    peak = peak_flops_per_device()
    mfu = None if peak is None else flops_per_token * tokens_per_s / peak  # one device: MeshConfig(data=1)
    print(
        json.dumps(
            {
                "device": device.device_kind,
                "params": model.num_parameters(vocab),
                "batch": batch,
                "seq_len": seq_len,
                "compute_dtype": str(trainer.compute_dtype),
                "tokens_per_s": round(tokens_per_s, 1),
                "flops_per_token": flops_per_token,
                "peak_flops": peak,
                "mfu": None if mfu is None else round(mfu, 4),
                "final_loss": rows[-1]["loss"],
            }
        )
    )


if __name__ == "__main__":
    main()
