"""Training throughput on CPU: our Llama (levanter Trainer) vs a PyTorch reference of the same
architecture (transformers' LlamaForCausalLM), same shapes, batch, seq_len, threads and optimizer,
in the same run.

    python bench/train_throughput.py                # the issue's shape: 4 layers, hidden 128, ...
    python bench/train_throughput.py --steps 10 --vocab 8192

Both sides time the same thing: whole optimizer steps (forward, backward, clipping, AdamW) after
warm-up steps that absorb compilation / allocator start-up. Ours goes through the real Trainer
(data prefetch, metrics per step), so framework overhead is included. The last line printed is
one JSON object with both rates and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--vocab", type=int, default=50257)  # GPT-2
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="timed steps per framework")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--untied", action="store_true", help="untied embeddings (default: tied)")
    return p.parse_args()


def configure_threads(threads: int) -> None:
    # Both frameworks get the same intra-op thread count; must be set before jax/torch start.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "force_host_platform_device_count" not in f)
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}".strip()
    os.environ["OMP_NUM_THREADS"] = str(threads)


def random_tokens(args, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, args.vocab, size=(args.steps + args.warmup_steps + 1) * args.batch * args.seq_len).astype(np.int32)


def bench_ours(args, tokens) -> float:
    import logging

    logging.getLogger("absl").setLevel(logging.WARNING)
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, Trainer, TrainerConfig
    from levanter.trainer.sources import InMemoryWindows

    model = LlamaConfig(
        hidden_dim=args.hidden, intermediate_dim=args.intermediate, num_layers=args.layers, num_heads=args.heads,
        num_kv_heads=args.kv_heads, max_seq_len=args.seq_len, tie_word_embeddings=not args.untied,
    )
    total = args.steps + args.warmup_steps
    config = TrainerConfig(
        num_train_steps=total, batch_size=args.batch, log_every=max(total, 1), mesh=MeshConfig(data=1),
        checkpoint_at_end=False, compute_dtype="float32",
    )
    source = InMemoryWindows(tokens, seq_len=args.seq_len, batch_size=args.batch)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(config, AdamConfig(3e-4, 0.1, lr_schedule="constant"), output_dir=out)
        result = trainer.train(lambda key: model.build(args.vocab, key=key), source)
    rows = [r for r in result.history if "loss" in r]
    t0, t1 = rows[args.warmup_steps - 1]["wall_time"], rows[-1]["wall_time"]
    return args.steps * args.batch * args.seq_len / (t1 - t0)


def bench_torch(args, tokens) -> float:
    import torch
    from transformers import LlamaConfig as HfLlamaConfig
    from transformers import LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = HfLlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq_len, tie_word_embeddings=not args.untied, rms_norm_eps=1e-5,
        attention_bias=False, mlp_bias=False,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
    )
    data = torch.from_numpy(tokens.astype("int64"))
    per_step = args.batch * args.seq_len

    def step(i):
        batch = data[i * per_step : (i + 1) * per_step].view(args.batch, args.seq_len)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # one host sync per step, as our metrics fetch does

    for i in range(args.warmup_steps):
        step(i)
    start = time.perf_counter()
    for i in range(args.warmup_steps, args.warmup_steps + args.steps):
        step(i)
    return args.steps * per_step / (time.perf_counter() - start)


def main() -> None:
    args = parse_args()
    configure_threads(args.threads)
    tokens = random_tokens(args)
    shape = f"{args.layers}L h{args.hidden} heads{args.heads} ffn{args.intermediate} V{args.vocab} T{args.seq_len} B{args.batch}"
    print(f"shape: {shape}; threads {args.threads}; {args.steps} timed steps after {args.warmup_steps} warm-up", file=sys.stderr)
    torch_rate = bench_torch(args, tokens)
    print(f"pytorch: {torch_rate:,.0f} tokens/s", file=sys.stderr)
    ours_rate = bench_ours(args, tokens)
    print(f"ours:    {ours_rate:,.0f} tokens/s", file=sys.stderr)
    print(
        json.dumps(
            {
                "ours_tokens_per_s": round(ours_rate, 1),
                "pytorch_tokens_per_s": round(torch_rate, 1),
                "ratio": round(ours_rate / torch_rate, 3),
                "shape": shape,
                "threads": args.threads,
                "steps": args.steps,
            }
        )
    )


if __name__ == "__main__":
    main()
