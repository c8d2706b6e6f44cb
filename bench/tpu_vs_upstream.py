"""Ours and upstream Levanter training Llama on the accelerator, shape by shape, each side in a process of its own.

    python bench/tpu_vs_upstream.py --upstream-python python3 --upstream-path /tmp/upstream-site
    python bench/tpu_vs_upstream.py ... --shapes llama_150m:16,llama_600m:4:save_matmuls,llama_600m:16:full:8
    python bench/tpu_vs_upstream.py --upstream-python /tmp/up-venv/bin/python --tiny      # the plumbing, on a CPU

A shape is ``MODEL:BATCH[:REMAT[:MICROBATCH]][:offload][:bf16]``: a Llama size of ``experiments/llama.py``
(or ``llama_nano``), the batch in sequences of ``--seq-len`` tokens, and for our side only a remat policy
(default: the config's), a microbatch, and memory levers: ``offload`` keeps the optimizer state in host
memory between steps, ``bf16`` stores Adam's moments in bfloat16 (``llama_1_4b:8:save_attention:offload:bf16``
is how llama_1_4b fits one v5e chip; upstream, at its defaults, gets the same shape and may not fit). Work is counted in model FLOPs, so what a side recomputes is
its own cost; upstream recomputes each layer, its default. For each shape our side
(``bench/tpu_step.py``: the trainer's compiled step) runs, then upstream's
(``bench/vs_upstream_sides/upstream_tpu_step.py``: its Llama through its own ``Trainer`` at its
accelerator defaults); a TPU admits one process at a time. Both train on the same batch (seeded
random tokens packed into documents with segment ids), f32 parameters, bf16 compute, AdamW with
clipping at 1.0, for ``--warmup-steps`` then ``--steps`` timed steps.

Upstream installs the import names ``levanter`` and ``haliax``, as ours does, so its processes get a
``PYTHONPATH`` of their own: this process's entries minus those inside this repository and our
third-party folders (``--ours-site``), which leaves the machine's own JAX, then ``--upstream-path``.
Its side refuses to run when the ``levanter`` it imports is not upstream's distribution.

Equal work: before anything trains, one CPU-only upstream process counts its parameters for every
shape, and a shape whose count differs from ours is refused (printed, not run); after the runs the
counts, batch, sequence length and device kind the two sides report must agree too, or the ratio is
withheld (``refused``). Every process runs under a timeout (``--side-timeout``) and the bench under
``--budget`` seconds: a side that fails, times out or is skipped for lack of time is reported in its
shape's line, and the rest go on. A process that finds the chip still held is retried once, 5 s later.

Prints one JSON line per shape: both sides' tokens/s, ms per step, MFU against the chip's bf16 peak
(``--peak-tflops``, 197 for a TPU v5e) and against the bf16 matmul our side measured in the same run
(one FLOP count for both: ours, 6N plus attention), compile seconds (ours: the step's compile;
upstream: initialisation, and compilation plus its first step), the compiled step's memory per chip
(XLA's memory analysis) and the runtime's ``peak_bytes_in_use``, and ours/upstream tokens/s; then one
summary line. On a TPU v5e the three default shapes should take about five minutes: six processes
on the chip, each about 15 s opening it, 10 to 15 s compiling and 10 steps of 0.3 to 1.7 s (upstream's
also importing its dependencies), and the CPU-only count; ``summary.wall_s`` says what it took.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OURS_STEP = BENCH / "tpu_step.py"
UPSTREAM_STEP = BENCH / "vs_upstream_sides" / "upstream_tpu_step.py"
sys.path.insert(0, str(BENCH))
from vs_upstream import SideFailed, run_side  # noqa: E402

# Our Llama keeps every activation by default ("none"); llama_600m fits one v5e chip only recomputing them.
DEFAULT_SHAPES = "llama_150m:16,llama_600m:8:full,llama_600m:16:full"
TINY_SHAPES = "llama_nano:2"
# What a chip that has just been let go of can say to the next process that opens it: worth one retry.
# Our side's memory levers, named after the positional fields: the optimizer state kept in host memory between
# steps, and Adam's moments stored in bfloat16 (bench/tpu_step.py's --offload and --moment-dtype).
SHAPE_FLAGS = ("offload", "bf16")
SHAPE_FORM = "MODEL:BATCH[:REMAT[:MICROBATCH]][:offload][:bf16]"
CHIP_BUSY = ("multi-process lockfile", "TPU is already in use", "Unable to initialize backend 'tpu'")


@dataclass(frozen=True)
class Shape:
    """One comparison: a Llama size, the batch, and our side's settings for it."""

    spec: str
    model: str
    batch: int
    remat: str | None
    microbatch: int | None
    offload: bool = False
    moment_dtype: str | None = None

    @classmethod
    def parse(cls, spec: str) -> "Shape":
        usage = f"--shapes: {spec!r} is not {SHAPE_FORM}, e.g. llama_600m:8:full or llama_1_4b:8:full:offload:bf16"
        parts = spec.split(":")
        if len(parts) < 2 or not parts[1].isdigit():
            raise SystemExit(usage)
        # Flags may follow the positional remat and microbatch; a flag is never a remat policy's name.
        flags = [part for part in parts[2:] if part in SHAPE_FLAGS]
        positional = [part for part in parts[2:] if part not in SHAPE_FLAGS]
        if len(positional) > 2 or parts[2 + len(positional):] != flags:
            raise SystemExit(usage)
        remat = positional[0] if positional and positional[0] else None
        microbatch = positional[1] if len(positional) > 1 and positional[1] else None
        if microbatch is not None and not microbatch.isdigit():
            raise SystemExit(f"--shapes: the microbatch of {spec!r} must be a whole number")
        return cls(spec, parts[0], int(parts[1]), remat, None if microbatch is None else int(microbatch),
                   offload="offload" in flags, moment_dtype="bfloat16" if "bf16" in flags else None)


@dataclass(frozen=True)
class Work:
    """What a shape asks of both sides: upstream's shape arguments, our parameter count, FLOPs per token."""

    upstream_shape: dict
    parameters: int
    flops_per_token: float


def work_of(shape: Shape, seq_len: int) -> Work:
    """Our Llama of ``shape.model`` read as upstream's shape arguments, its parameters and its FLOPs per token."""
    from experiments.llama import LLAMA3_VOCAB_SIZE, LLAMA_SIZES, llama_nano

    sizes = {**LLAMA_SIZES, "llama_nano": (llama_nano, LLAMA3_VOCAB_SIZE)}
    if shape.model not in sizes:
        raise SystemExit(f"--shapes: unknown model {shape.model!r}; choose one of {', '.join(sorted(sizes))}")
    config, vocab = sizes[shape.model]
    upstream = {"layers": config.num_layers, "hidden": config.hidden_dim, "intermediate": config.intermediate_dim,
                "heads": config.num_heads, "kv_heads": config.num_kv_heads, "vocab": vocab, "seq_len": seq_len,
                "tied": config.tie_word_embeddings}
    return Work(upstream, config.num_parameters(vocab), config.flops_per_token(vocab, seq_len))


def upstream_env(base: dict[str, str], upstream_path: str, ours_site: list[str]) -> dict[str, str]:
    """``base`` with a ``PYTHONPATH`` of the machine's own folders, then upstream's: nothing of ours."""
    sites = {Path(site).resolve() for site in ours_site if site}

    def ours(entry: str) -> bool:
        resolved = Path(entry).resolve()
        return resolved == ROOT or ROOT in resolved.parents or resolved in sites

    machine = [entry for entry in base.get("PYTHONPATH", "").split(os.pathsep) if entry and not ours(entry)]
    upstream = [entry for entry in upstream_path.split(os.pathsep) if entry]
    leaked = [entry for entry in upstream if ours(entry)]
    if leaked:
        raise SystemExit(f"--upstream-path names our own folders {leaked}: upstream must not see our packages")
    return {**base, "PYTHONPATH": os.pathsep.join(machine + upstream), "WANDB_MODE": "disabled"}


def headline(error: str) -> str:
    """The line of a failed side's output that says why: its last error line (a run's first lines are often
    warnings, e.g. about the Python version), else its first line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    said = [line for line in lines if "Error" in line or "error:" in line.lower()]
    return (said[-1] if said else lines[0] if lines else "failed")[:200]


class Runner:
    """Runs each side's process under the bench's budget; a failure becomes a record, never an exception."""

    def __init__(self, budget_s: float, side_timeout_s: float):
        self.deadline = time.monotonic() + budget_s
        self.side_timeout_s = side_timeout_s

    def run(self, name: str, argv: list[str], env: dict[str, str]) -> dict:
        record = self._run(argv, env)
        said = headline(record["error"]) if "error" in record \
            else f"{record['tokens_per_s']} tokens/s" if "tokens_per_s" in record else "done"
        print(f"{name}: {said} ({record.get('wall_s')} s)", file=sys.stderr, flush=True)
        return record

    def _run(self, argv: list[str], env: dict[str, str]) -> dict:
        for attempt in range(2):
            left = self.deadline - time.monotonic()
            if left < 20:
                return {"error": f"skipped: {max(left, 0):.0f} s of the bench's budget left"}
            started = time.monotonic()
            try:
                with tempfile.TemporaryDirectory(prefix="tpu-vs-upstream-") as scratch:
                    record = run_side(argv, env={**env, "TMPDIR": scratch}, cwd=scratch,
                                      timeout=min(self.side_timeout_s, left)).record
                return {**record, "wall_s": round(time.monotonic() - started, 1)}
            except SideFailed as failure:
                message = str(failure)
                if attempt == 0 and any(text in message for text in CHIP_BUSY):
                    print(f"the chip was busy; again in 5 s: {message[-300:]}", file=sys.stderr, flush=True)
                    time.sleep(5)
                    continue
                return {"error": message[-2500:], "wall_s": round(time.monotonic() - started, 1)}
        return {"error": "unreachable"}


def count_upstream_parameters(runner: Runner, python: str, env: dict[str, str], works: list[Work]) -> list[int] | str:
    """Upstream's parameter count of each shape, from one process kept off the accelerator; or why not."""
    argv = [python, str(UPSTREAM_STEP), "--count-parameters", json.dumps([work.upstream_shape for work in works])]
    record = runner.run("upstream's parameter counts", argv, {**env, "JAX_PLATFORMS": "cpu"})
    return record["parameters"] if "parameters" in record else record["error"]


def side_figures(record: dict, work: Work, peak_tflops: float, matmul_tflops: float | None) -> dict:
    """A side's figures, its MFU computed with our FLOP count (the same for both sides)."""
    if "error" in record:
        return record
    model_flops = work.flops_per_token * record["tokens_per_s"]
    keep = ("tokens_per_s", "step_ms", "step_ms_each", "loss", "parameters", "remat", "microbatch", "offload",
            "moment_dtype", "compile_s", "init_s", "compile_and_first_step_s", "memory_gib", "memory_note",
            "memory_analysis_s", "peak_bytes_in_use_gib", "device_kind", "attention", "scan_layers",
            "gradient_checkpointing", "version", "jax", "packages", "wall_s")
    return {"mfu": round(model_flops / (peak_tflops * 1e12), 4),
            "mfu_of_matmul": None if not matmul_tflops else round(model_flops / (matmul_tflops * 1e12), 4),
            **{key: record[key] for key in keep if key in record}}


def unequal(ours: dict, upstream: dict, batch: int, seq_len: int) -> str | None:
    """Why the two runs did not do the same work, or None."""
    if "error" in ours or "error" in upstream:
        return None
    found = [f"{key} differ: ours {ours.get(key)}, upstream {upstream.get(key)}"
             for key in ("parameters", "device_kind") if ours.get(key) != upstream.get(key)]
    found += [f"{key} {side.get(key)} is not {want}" for side in (ours, upstream)
              for key, want in (("batch", batch), ("seq_len", seq_len)) if side.get(key) != want]
    return "; ".join(found) or None


def compare(shape: Shape, work: Work, ours: dict, upstream: dict, args: argparse.Namespace,
            matmul_tflops: float | None) -> dict:
    """One shape's JSON line."""
    refused = unequal(ours, upstream, shape.batch, args.seq_len)
    both = "error" not in ours and "error" not in upstream
    line = {"shape": shape.spec, "model": shape.model, "batch": shape.batch, "seq_len": args.seq_len,
            "tokens_per_step": shape.batch * args.seq_len, "parameters": work.parameters,
            "flops_per_token": work.flops_per_token, "peak_tflops": args.peak_tflops, "matmul_tflops": matmul_tflops,
            "ratio": round(ours["tokens_per_s"] / upstream["tokens_per_s"], 3) if both and not refused else None,
            "ours": side_figures(ours, work, args.peak_tflops, matmul_tflops),
            "upstream": side_figures(upstream, work, args.peak_tflops, matmul_tflops)}
    if refused:
        line["refused"] = refused
    return line


def our_argv(args: argparse.Namespace, shape: Shape) -> list[str]:
    argv = [args.ours_python, str(OURS_STEP), "--model", shape.model, "--batch", str(shape.batch), "--seq-len",
            str(args.seq_len), "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
            "--doc-len", *map(str, args.doc_len), "--label", shape.spec]
    argv += ["--remat", shape.remat] if shape.remat else []
    argv += ["--microbatch", str(shape.microbatch)] if shape.microbatch else []
    argv += ["--offload"] if shape.offload else []
    argv += ["--moment-dtype", shape.moment_dtype] if shape.moment_dtype else []
    argv += [] if args.matmul else ["--no-matmul"]
    return argv + shlex.split(args.ours_args)


def upstream_argv(args: argparse.Namespace, shape: Shape, work: Work) -> list[str]:
    argv = [args.upstream_python, str(UPSTREAM_STEP)]
    argv += [f"--{key.replace('_', '-')}={value}" for key, value in work.upstream_shape.items() if key != "tied"]
    argv += ["--tied"] if work.upstream_shape["tied"] else []
    argv += ["--batch", str(shape.batch), "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
             "--doc-len", *map(str, args.doc_len)]
    return argv + shlex.split(args.upstream_args)


def git_commit() -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream-python", required=True, help="upstream's interpreter (python3 on the TPU machine)")
    p.add_argument("--upstream-path", default="", help="upstream's folders for its PYTHONPATH, after the machine's own "
                   "(e.g. /tmp/upstream-site; empty when --upstream-python's own environment holds upstream)")
    p.add_argument("--ours-site", default="/tmp/site", help="our third-party folders (os.pathsep-separated), kept off "
                   "upstream's path")
    p.add_argument("--ours-python", default=sys.executable)
    p.add_argument("--shapes", default=None, help=f"{SHAPE_FORM},... (default {DEFAULT_SHAPES})")
    p.add_argument("--seq-len", type=int, default=None, help="default 2048 (--tiny: 128)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 8; --tiny: 2)")
    p.add_argument("--warmup-steps", type=int, default=None, help="default 2 (--tiny: 1)")
    p.add_argument("--doc-len", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="the packed documents' lengths (default 100 600; --tiny: 16 64)")
    p.add_argument("--matmul", action=argparse.BooleanOptionalAction, default=None,
                   help="our side times a bf16 8192^3 matmul too (default on; --tiny: off)")
    p.add_argument("--ours-args", default="", help="more arguments for bench/tpu_step.py, e.g. --ours-args='--set x=1'")
    p.add_argument("--upstream-args", default="", help="more arguments for upstream_tpu_step.py")
    p.add_argument("--peak-tflops", type=float, default=197.0, help="the chip's bf16 peak (TPU v5e: 197)")
    p.add_argument("--budget", type=float, default=520.0, help="seconds for the whole bench; runs that would start "
                   "later are reported as skipped")
    p.add_argument("--side-timeout", type=float, default=240.0, help="seconds for one side's process")
    p.add_argument("--tiny", action="store_true", help="CPU-sized defaults: the plumbing, not figures that mean anything")
    args = p.parse_args(argv)
    tiny = dict(shapes=TINY_SHAPES, seq_len=128, steps=2, warmup_steps=1, doc_len=[16, 64], matmul=False)
    chip = dict(shapes=DEFAULT_SHAPES, seq_len=2048, steps=8, warmup_steps=2, doc_len=[100, 600], matmul=True)
    for key, value in (tiny if args.tiny else chip).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    # No persistent compilation cache: each side's compile seconds are a real compile.
    children = {key: value for key, value in os.environ.items()
                if not key.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    os.environ["JAX_PLATFORMS"] = "cpu"  # this process only reads configs: it must not take the chip
    sys.path[:0] = [str(ROOT)]
    shapes = [Shape.parse(spec) for spec in args.shapes.split(",") if spec]
    works = [work_of(shape, args.seq_len) for shape in shapes]
    upstream_children = upstream_env(children, args.upstream_path, args.ours_site.split(os.pathsep))
    runner = Runner(args.budget, args.side_timeout)

    counts = count_upstream_parameters(runner, args.upstream_python, upstream_children, works)
    if isinstance(counts, str):  # both sides still run: ours' figures stand, and the counts they print are compared
        print(f"upstream's parameters could not be counted before the runs: {counts}", file=sys.stderr, flush=True)
    matmul_tflops, lines = None, []
    for index, (shape, work) in enumerate(zip(shapes, works)):
        upstream_count = None if isinstance(counts, str) else counts[index]
        if upstream_count is not None and upstream_count != work.parameters:
            lines.append({"shape": shape.spec, "refused": f"parameters differ: ours {work.parameters}, upstream "
                          f"{upstream_count}: not the same work, not run", "ratio": None})
        else:
            ours = runner.run(f"{shape.spec} ours", our_argv(args, shape), children)
            matmul_tflops = ours.get("matmul_tflops", matmul_tflops)
            upstream = runner.run(f"{shape.spec} upstream", upstream_argv(args, shape, work), upstream_children)
            lines.append(compare(shape, work, ours, upstream, args, matmul_tflops))
            if isinstance(counts, str):
                lines[-1]["parameters_not_counted_before"] = counts[-500:]
        print(json.dumps(lines[-1]), flush=True)
    print(json.dumps({"summary": {
        "ratios": {line["shape"]: line["ratio"] for line in lines}, "wall_s": round(time.monotonic() - started, 1),
        "budget_s": args.budget, "commit": git_commit(), "steps": args.steps, "warmup_steps": args.warmup_steps,
        "upstream_pythonpath": upstream_children["PYTHONPATH"], "ours_python": args.ours_python,
        "upstream_python": args.upstream_python}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
