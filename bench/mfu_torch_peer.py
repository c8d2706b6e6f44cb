"""The PyTorch peer of bench/mfu.py: the same model shape trained the usual PyTorch way, timed alike.

    python bench/mfu_torch_peer.py --hf-config '{"model_type": "llama", ...}' --batch 8 --seq-len 2048

``--hf-config`` is the ``config.json`` of the Hugging Face model with our shape, as
``levanter.compat`` exports it (bench/mfu.py passes it), so hidden, intermediate, layers, heads, kv
heads, vocabulary, tying and experts are ours by construction. The recipe is the common one:
``transformers``' ``LlamaForCausalLM`` / ``MixtralForCausalLM`` with f32 weights, SDPA attention,
bf16 autocast, fused AdamW and ``torch.compile`` on CUDA (f32, unfused, not compiled on CPU unless
asked), gradient clipping at 1.0, the router's balancing loss included for Mixtral.

Data: uniform random tokens, one sequence per row; no packed documents, so attention is plainly
causal. Timing: whole optimizer steps after ``--warmup-steps`` (compilation, allocator warm-up);
each step's loss is read after the next step has been queued, as our trainer reads its metrics.
The last line is one JSON object. Run in its own process, so it never shares device memory with JAX.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

DATA_NOTE = "uniform random tokens, one sequence per row: no packed documents, plain causal attention"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-config", required=True, help="config.json of the model, as a JSON string")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on CUDA only)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads on CPU")
    p.add_argument("--flops-per-token", type=float, default=None, help="for MFU; bench/mfu.py passes ours")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_model(hf_config: dict, device):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in hf_config.items() if k not in ("architectures", "torch_dtype", "dtype")}
    model_type = fields.pop("model_type")
    if model_type == "mixtral":
        fields["output_router_logits"] = True  # the balancing loss is part of our objective too
    config = AutoConfig.for_model(model_type, **fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return model.train()


def peak_flops(device_name: str) -> float | None:
    # The same table as our side's MFU; importing it starts no JAX backend.
    try:
        from levanter.trainer.hardware import peak_flops_per_device
    except ImportError:
        return None
    return peak_flops_per_device(device_name)


def main(argv=None) -> None:
    args = parse_args(argv)
    import numpy as np
    import torch
    import transformers

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_cuda = device.type == "cuda"
    if args.threads and not on_cuda:
        torch.set_num_threads(args.threads)
    compile_model = on_cuda if args.compile is None else args.compile
    torch.manual_seed(args.seed)

    hf_config = json.loads(args.hf_config)
    model = build_model(hf_config, device)
    params = list(model.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=on_cuda,
    )
    forward = torch.compile(model) if compile_model else model
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if on_cuda else contextlib.nullcontext

    total = args.warmup_steps + args.steps
    rng = np.random.default_rng(args.seed)
    vocab = hf_config["vocab_size"]
    batches = torch.from_numpy(rng.integers(0, vocab, size=(total, args.batch, args.seq_len))).to(device)

    def step(i):
        with autocast():
            loss = forward(input_ids=batches[i], labels=batches[i]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def synchronize():
        if on_cuda:
            torch.cuda.synchronize(device)

    started = time.perf_counter()
    first_step_s = None
    for i in range(args.warmup_steps):
        loss = step(i).item()
        if first_step_s is None:
            first_step_s = time.perf_counter() - started
    synchronize()
    start = time.perf_counter()
    pending, losses = None, []
    for i in range(args.warmup_steps, total):
        loss = step(i)
        if pending is not None:
            losses.append(pending.item())  # the previous step's, while this one runs
        pending = loss
    losses.append(pending.item())
    synchronize()
    tokens_per_s = args.steps * args.batch * args.seq_len / (time.perf_counter() - start)

    device_name = torch.cuda.get_device_name(device) if on_cuda else "cpu"
    peak = peak_flops(device_name) if args.flops_per_token else None
    mfu = args.flops_per_token * tokens_per_s / peak if peak else None
    experts = None
    if hf_config["model_type"] == "mixtral":
        experts = getattr(model.config, "_experts_implementation", None)
    print(
        json.dumps(
            {
                "framework": "pytorch",
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "device": device_name,
                "model_type": hf_config["model_type"],
                "params": sum(p.numel() for p in params),
                "batch": args.batch,
                "seq_len": args.seq_len,
                "steps": args.steps,
                "warmup_steps": args.warmup_steps,
                "compute_dtype": "bfloat16 autocast, f32 weights" if on_cuda else "float32",
                "attention": model.config._attn_implementation,
                "experts": experts,
                "compiled": compile_model,
                "fused_adamw": on_cuda,
                "data": DATA_NOTE,
                "tokens_per_s": round(tokens_per_s, 1),
                "first_step_s": round(first_step_s, 2) if first_step_s is not None else None,
                "flops_per_token": args.flops_per_token,
                "peak_flops": peak,
                "mfu": None if mfu is None else round(mfu, 4),
                "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if on_cuda else None,
                "final_loss": losses[-1],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
