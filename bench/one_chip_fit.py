"""Whether a model's training step fits one TPU chip with each way of keeping Adam's moments, found by
compiling it here for the chip (libtpu, no chip needed).

    python bench/one_chip_fit.py                          # llama_1_4b, batch 8 x 2048, remat full, one v5e chip
    python bench/one_chip_fit.py --model llama_600m --batch 16 --limits 15,14

The step is the trainer's own (``levanter.trainer.ahead_of_time.compile_train_step``; the model as
``bench/tpu_step.py`` builds it: scanned layers, ``--remat``), with AdamW's moments in float32 or
bfloat16 (``AdamConfig.moment_dtype``), on the chip or in the host's memory
(``TrainerConfig.offload_optimizer_state``). For each setting it prints XLA's memory analysis per chip
(GiB: arguments, temporaries, outputs, host, peak) or, where XLA refuses the step, the bytes it asked
for; then, for each setting that fits, whether it still compiles for a chip of each of ``--limits``
GiB (``memory_limit``): its headroom. With the state offloaded that is the only measure, as the
analysis then overstates the chip's share (see ``StepMemory``).

One JSON object per compile, then a table. A 1.4B step that fits takes 2 to 6 minutes to compile on
two CPU cores; a refusal a few seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30

# (moment dtype, offloaded), in the order of the table.
SETTINGS = (("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama_1_4b", help="a size from experiments/llama.py or experiments/moe.py")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--remat", default="full")
    p.add_argument("--topology", default="v5e:2x2", help="libtpu's topology; its first chip is the one compiled for")
    p.add_argument("--limits", default="15,13.5", help="GiB: compile each fitting setting again for chips this small")
    return p.parse_args(argv)


def compile_one(args, config, vocab, devices, moment_dtype: str, offload: bool, limit_gib: float | None) -> dict:
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, TrainerConfig
    from levanter.trainer.ahead_of_time import compile_train_step

    trainer = TrainerConfig(num_train_steps=10, batch_size=args.batch, mesh=MeshConfig(data=1), offload_optimizer_state=offload)
    optimizer = AdamConfig(learning_rate=3e-4, weight_decay=0.1, max_grad_norm=1.0, moment_dtype=moment_dtype)
    started = time.perf_counter()
    step = compile_train_step(lambda key: config.build(vocab, key=key), trainer, optimizer, seq_len=args.seq_len,
                              devices=devices, memory_limit=None if limit_gib is None else int(limit_gib * GIB))
    row = {"model": args.model, "batch": args.batch, "seq_len": args.seq_len, "remat": config.remat,
           "moment_dtype": moment_dtype, "offload": offload, "limit_gib": limit_gib, "fits": step.fits,
           "seconds": round(time.perf_counter() - started, 1)}
    if step.fits:
        memory = dataclasses.asdict(step.memory)
        row["memory_gib"] = {name: None if value is None else round(value / GIB, 2) for name, value in memory.items()}
    else:
        row["needed_gib"] = None if step.needed_bytes is None else round(step.needed_bytes / GIB, 2)
        row["available_gib"] = None if step.available_bytes is None else round(step.available_bytes / GIB, 2)
    return row


def table(rows: list[dict], limits: list[float]) -> str:
    lines = ["| moments | state | arguments | temporaries | outputs | host | XLA peak | "
             + " | ".join(f"fits {limit:g} GiB" for limit in limits) + " |",
             "| --- | --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in limits) + " |"]
    for moment_dtype, offload in SETTINGS:
        own = next((r for r in rows if (r["moment_dtype"], r["offload"], r["limit_gib"]) == (moment_dtype, offload, None)), None)
        if own is None:
            continue
        place = "host" if offload else "chip"
        if own["fits"]:
            m = own["memory_gib"]
            cells = [m["arguments"], m["temporaries"], m["outputs"], m["host"], m["peak"]]
        else:
            cells = [f"does not fit: asks {own['needed_gib']} of {own['available_gib']}", "", "", "", ""]
        for limit in limits:
            found = next((r for r in rows if (r["moment_dtype"], r["offload"], r["limit_gib"]) == (moment_dtype, offload, limit)), None)
            cells.append("" if found is None else "yes" if found["fits"] else f"no (asks {found['needed_gib']})")
        lines.append(f"| {moment_dtype} | {place} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    # Compiling needs libtpu, never a chip: run on the CPU beside whatever else loads libtpu.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    args = parse_args(argv)
    from tpu_step import model_config

    from levanter.trainer.ahead_of_time import tpu_topology_devices

    config, vocab = model_config(argparse.Namespace(model=args.model, seq_len=args.seq_len, remat=args.remat,
                                                    attention=None, set=[]))
    devices = tpu_topology_devices(args.topology)[:1]
    limits = [float(x) for x in args.limits.split(",") if x.strip()]
    rows = []
    for moment_dtype, offload in SETTINGS:
        row = compile_one(args, config, vocab, devices, moment_dtype, offload, None)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not row["fits"]:
            continue
        for limit in limits:
            rows.append(compile_one(args, config, vocab, devices, moment_dtype, offload, limit))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.model}, batch {args.batch} x {args.seq_len}, remat {config.remat}, one {devices[0].device_kind} chip "
          f"(GiB per chip; XLA's memory analysis where the step fits the chip's own memory):\n")
    print(table(rows, limits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
