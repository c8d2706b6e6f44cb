"""Time the bare training step of one model on the accelerator, and (``--profile``) say where its time goes.

    python bench/tpu_step.py --model llama_600m --batch 8                  # tokens/s, MFU, memory
    python bench/tpu_step.py --model llama_600m --batch 8 --remat save_matmuls
    python bench/tpu_step.py --model llama_600m --batch 8 --profile /tmp/trace --top 40
    python bench/tpu_step.py --model llama_1_4b --batch 8 --remat full --offload --moment-dtype bfloat16

The step is the trainer's own (``levanter.trainer.ahead_of_time.train_step_function``: the same
program :class:`levanter.trainer.Trainer` compiles, parameters f32, compute bf16 on accelerators,
AdamW with clipping), on random tokens packed into documents of ``--doc-len`` tokens with segment ids,
so attention is masked per document as in training. It leaves out the loader, logging and
checkpoints, which ``bench/mfu.py`` keeps: this is the number the compiler and kernels decide.

Printed, one JSON object per ``--config`` (each in a process of its own when several are given, so that
each has the whole chip): tokens/s over the timed steps, MFU against the chip's bf16 peak (model FLOPs
only: ``flops_per_token`` of the config, 6N plus attention, whatever the remat policy recomputes) and
against a bf16 matmul measured in the same process (``--matmul``), compile seconds, the compiled step's
memory per chip (XLA's memory analysis) beside the runtime's ``peak_bytes_in_use``.

``--profile DIR``: also trace ``--profile-steps`` steps with ``jax.profiler`` into DIR and print the
device time by operation (the ``--top`` largest, each with the source op it came from), summed over
the traced steps and divided by their number: the time of one step by part.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama_600m", help="a size from experiments/llama.py or experiments/moe.py")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--remat", default=None, help="the model's remat policy (default: the config's)")
    p.add_argument("--microbatch", type=int, default=None)
    p.add_argument("--offload", action="store_true",
                   help="keep the optimizer's state in the host's memory between steps (TrainerConfig.offload_optimizer_state)")
    p.add_argument("--moment-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="what Adam's moments are stored in (AdamConfig.moment_dtype)")
    p.add_argument("--attention", default=None)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a field of the model config (JSON value), e.g. --set use_scan=false")
    p.add_argument("--doc-len", type=int, nargs=2, default=(100, 600), metavar=("MIN", "MAX"))
    p.add_argument("--matmul", action=argparse.BooleanOptionalAction, default=True,
                   help="also time a bf16 8192^3 matmul, the chip's practical peak")
    p.add_argument("--profile", default=None, metavar="DIR")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--label", default=None, help="a name for this configuration in the output")
    return p.parse_args(argv)


def model_config(args):
    from experiments.llama import LLAMA3_VOCAB_SIZE, LLAMA_SIZES, llama_nano
    from experiments.moe import MOE_SIZES

    sizes = {name: (config, vocab) for name, (config, vocab) in LLAMA_SIZES.items()}
    sizes["llama_nano"] = (llama_nano, LLAMA3_VOCAB_SIZE)
    sizes.update({name: (config, vocab) for name, (config, vocab, *_) in MOE_SIZES.items()})
    if args.model not in sizes:
        raise SystemExit(f"Unknown --model {args.model!r}; choose one of: {', '.join(sorted(sizes))}")
    config, vocab = sizes[args.model]
    changes = {"use_scan": True, "max_seq_len": max(config.max_seq_len, args.seq_len)}
    if args.remat:
        changes["remat"] = args.remat
    if args.attention:
        changes["attention"] = args.attention
    for item in args.set:
        name, _, value = item.partition("=")
        changes[name] = json.loads(value)
    return dataclasses.replace(config, **changes), vocab


def random_batch(rows: int, seq_len: int, vocab: int, doc_len: tuple[int, int], seed: int = 0):
    """Tokens with documents of random lengths packed end to end (segment ids 0, 1, 2, ... per row)."""
    import numpy as np

    from levanter.data.batch import Batch

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(rows, seq_len), dtype=np.int32)
    segments = np.zeros((rows, seq_len), np.int32)
    for row in range(rows):
        position, segment = 0, 0
        while position < seq_len:
            length = int(rng.integers(doc_len[0], doc_len[1] + 1))
            segments[row, position:position + length] = segment
            position, segment = position + length, segment + 1
    return Batch(tokens=tokens, loss_mask=np.ones((rows, seq_len), np.float32), segment_ids=segments)


def matmul_tflops(repeats: int = 10) -> float:
    import jax
    import jax.numpy as jnp

    n = 8192
    a = jnp.ones((n, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: a @ b)
    f(a, a).block_until_ready()
    started = time.perf_counter()
    for _ in range(repeats):
        out = f(a, a)
    out.block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - started) / 1e12


# Operations whose events span the operations they run (a loop's body, a branch).
CONTAINER_OPCODES = ("while", "conditional", "call")
OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")


def device_time_by_op(trace_dir: str, steps: int, top: int) -> list[dict]:
    """Device time per HLO operation in the newest trace under ``trace_dir``, per step."""
    import glob

    from jax.profiler import ProfileData

    path = max(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    profile = ProfileData.from_file(path)
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    sources: dict[str, str] = {}
    for plane in profile.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if line.name != "XLA Ops":
                continue
            for event in line.events:
                name, _, text = event.name.partition(" = ")
                opcode = OPCODE.search(text).group(1) if OPCODE.search(text) else ""
                if opcode in CONTAINER_OPCODES:  # their time is their contents', counted op by op
                    continue
                totals[name] += event.duration_ns
                counts[name] += 1
                if name not in sources:
                    stats = dict(event.stats)
                    sources[name] = (str(stats.get("tf_op") or stats.get("long_name") or "") or text)[:200]
    if not totals:  # name what the trace holds, to find the device's lines on another runtime
        return [{"planes": {plane.name: [line.name for line in plane.lines] for plane in profile.planes}}]
    whole = sum(totals.values())
    ranked = sorted(totals, key=totals.get, reverse=True)[:top]
    return [{"op": name, "ms_per_step": round(totals[name] / steps / 1e6, 3), "share": round(totals[name] / whole, 4),
             "calls_per_step": counts[name] / steps, "source": sources[name]} for name in ranked]


def run(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from levanter.optim import AdamConfig
    from levanter.trainer.ahead_of_time import StepMemory, batch_sharding_of, check_batch_splits, mesh_of, train_step_function
    from levanter.trainer.config import TrainerConfig
    from levanter.trainer.hardware import peak_flops_per_device
    from levanter.trainer.initial_state import init_train_state
    from levanter.trainer.mixed_precision import resolve_compute_dtype
    from levanter.trainer.step import DeviceBatch

    config, vocab = model_config(args)
    trainer = TrainerConfig(num_train_steps=args.warmup_steps + args.steps + args.profile_steps, batch_size=args.batch,
                            microbatch_size=args.microbatch, offload_optimizer_state=args.offload)
    optimizer = AdamConfig(learning_rate=3e-4, weight_decay=0.1, max_grad_norm=1.0, moment_dtype=args.moment_dtype)
    mesh = mesh_of(jax.devices(), trainer.mesh)
    check_batch_splits(trainer, mesh)
    dtype = resolve_compute_dtype("auto")
    state, static, opt = init_train_state(lambda k: config.build(vocab, key=k), trainer, optimizer, mesh)
    step = train_step_function(static, opt, trainer, optimizer, jax.tree.map(lambda x: x.sharding, state), mesh, dtype)
    batch = random_batch(args.batch, args.seq_len, vocab, tuple(args.doc_len))
    device_batch = jax.device_put(DeviceBatch(batch.tokens, batch.loss_mask, batch.segment_ids), batch_sharding_of(mesh))
    rate = jnp.asarray(3e-4, jnp.float32)

    started = time.perf_counter()
    compiled = step.lower(state, device_batch, rate).compile()
    compile_seconds = time.perf_counter() - started
    memory = StepMemory.of(compiled)
    for _ in range(args.warmup_steps):
        state, metrics = compiled(state, device_batch, rate)
    float(metrics["loss"])
    started = time.perf_counter()
    for _ in range(args.steps):
        state, metrics = compiled(state, device_batch, rate)
    loss = float(metrics["loss"])
    seconds = time.perf_counter() - started
    tokens_per_second = args.batch * args.seq_len * args.steps / seconds
    flops_per_token = config.flops_per_token(vocab, args.seq_len)
    peak = peak_flops_per_device()
    stats = jax.devices()[0].memory_stats() or {}
    result = {
        "label": args.label or f"{args.model} b{args.batch} remat={config.remat}"
                 + (" offload" if args.offload else "") + (f" moments={args.moment_dtype}" if args.moment_dtype != "float32" else ""),
        "model": args.model, "parameters": config.num_parameters(vocab), "batch": args.batch, "seq_len": args.seq_len,
        "remat": config.remat, "microbatch": args.microbatch, "offload": args.offload, "moment_dtype": args.moment_dtype,
        "steps": args.steps, "loss": round(loss, 4),
        "step_ms": round(1000 * seconds / args.steps, 2), "tokens_per_s": round(tokens_per_second, 1),
        "mfu": None if peak is None else round(flops_per_token * tokens_per_second / peak, 4),
        "device_kind": jax.devices()[0].device_kind, "compile_s": round(compile_seconds, 1),
        "memory_gib": {k: round(v / 2**30, 3) for k, v in {**dataclasses.asdict(memory), "total": memory.total}.items()},
        "peak_bytes_in_use_gib": round(stats.get("peak_bytes_in_use", 0) / 2**30, 3) if stats else None,
    }
    if args.matmul:
        achievable = matmul_tflops()
        result["matmul_tflops"] = round(achievable, 1)
        result["mfu_of_matmul"] = round(flops_per_token * tokens_per_second / (achievable * 1e12), 4)
    if args.profile:
        jax.profiler.start_trace(args.profile)
        for _ in range(args.profile_steps):
            state, metrics = compiled(state, device_batch, rate)
        float(metrics["loss"])
        jax.profiler.stop_trace()
        result["by_op"] = device_time_by_op(args.profile, args.profile_steps, args.top)
    del np
    return result


def main(argv=None) -> int:
    sys.path[:0] = [str(ROOT)]
    args = parse_args(argv)
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
