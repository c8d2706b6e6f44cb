"""A real small IsoFLOP sweep on the TinyStories sample, shared by several workers, then the scaling fits.

    python bench/scaling_sweep.py                    # the script's sweep: 16 runs, 7.3e12 FLOPs, two workers
    python bench/scaling_sweep.py --workers 1 --prefix /tmp/scaling   # one worker; keep the outputs there
    python bench/scaling_sweep.py --tiny             # 9 runs of a few steps (smoke check, about a minute)

It walks the path docs/scaling.md describes, with nothing special for the benchmark:

1. ``experiments/tutorials/isoflop_sweep.py`` declares the sweep with its own defaults (3
   budgets, Llama models of 4 layers and widths 8 to 96, a 1,024-token BPE, sequences of 128 in
   batches of 4, at least 150 steps and at most 2M tokens a run: the sample is about 0.5M tokens),
   with the sample's ``train.jsonl`` as the source and its ``validation.jsonl`` for the loss;
2. ``--workers`` copies of ``marin run`` on one prefix share it, each step run once by whichever
   worker takes its lease first;
3. :func:`marin.scaling.analysis.analyse` fits the IsoFLOP and parametric laws, and the report
   ``marin scaling`` prints is printed, with the plot written beside the outputs.

Data: the shared TinyStories sample (``data/tinystories/{train,validation}.jsonl`` under
``MARIN_TEST_DATA``, else ``shared/`` beside the checkout, else ``~/.cache/marin/test-data``).
Without it the script prints why and exits 0.

Prints the machine, the wall time, which worker ran how many steps, the tokens and FLOPs trained
(and their rate over the wall time, compilation included), then the fits; ``--out FILE`` also
writes one JSON object with the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimizer_comparison import REPO, find_sample  # noqa: E402  (one place knows where the sample lives)

SCRIPT = REPO / "experiments" / "tutorials" / "isoflop_sweep.py"
STEPS = "sweeps/isoflop-tinystories/*"

FULL: dict[str, str] = {}  # the script's own defaults
TINY = {
    "budgets": "[2e9, 6e9, 2e10]",
    "widths": "[16, 32, 48]",
    "vocab_size": "1024",
    "seq_len": "64",
    "batch_size": "4",
    "min_steps": "3",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="marin run processes sharing the sweep (default 2)")
    parser.add_argument("--prefix", help="where the outputs go (default: a new temporary folder, kept)")
    parser.add_argument("--data", help="the folder holding data/tinystories (default: where the tests look)")
    parser.add_argument("--tiny", action="store_true", help="a 9-run sweep of a few steps each (smoke check)")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap refits for the intervals")
    parser.add_argument("--out", help="also write the figures as one JSON object to this file")
    args = parser.parse_args()

    root, missing = find_sample(args.data)
    if root is None:
        print(f"scaling_sweep: skipped, {missing}")
        return 0
    prefix = Path(args.prefix or tempfile.mkdtemp(prefix="marin-scaling-bench-")).resolve()
    prefix.mkdir(parents=True, exist_ok=True)
    stories = root / "data" / "tinystories"
    settings = {**(TINY if args.tiny else FULL), "source": str(stories / "train.jsonl"),
                "validation": str(stories / "validation.jsonl")}
    if args.tiny:
        settings["sample_count"] = "300"
    command = [sys.executable, "-m", "marin.cli", "run", str(SCRIPT), "--prefix", str(prefix), "--max-concurrent", "1"]
    for key, value in settings.items():
        command += ["--set", f"sweep.{key}={value}"]

    print(f"machine: {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores")
    print(f"sweep: {SCRIPT.relative_to(REPO)} with {' '.join(f'{k}={v}' for k, v in settings.items() if k not in ('source', 'validation'))}")
    print(f"data: {stories}; outputs: {prefix}; {args.workers} worker(s)")
    started = time.monotonic()
    logs = [prefix.parent / f"{prefix.name}-worker{i}.log" for i in range(args.workers)]
    workers = []
    for log in logs:
        with open(log, "w") as handle:
            workers.append(subprocess.Popen(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT))
        time.sleep(2.0)  # the first worker tokenizes; the others find those steps held and wait or work
    codes = [worker.wait() for worker in workers]
    wall = time.monotonic() - started
    if any(codes):
        print(f"a worker failed (exit codes {codes}); see {', '.join(map(str, logs))}")
        return 1
    ran = [len(set(re.findall(r"Step (sweeps/\S+) started:", log.read_text()))) for log in logs]

    from marin.scaling.analysis import analyse
    from marin.scaling.cli import report_text
    from marin.scaling.plot import plot_scaling

    analysis = analyse(str(prefix), steps=STEPS, bootstrap=args.bootstrap)
    runs = analysis.collected.runs
    tokens, flops = sum(r.tokens for r in runs), sum(r.flops for r in runs)
    print(f"\nwall time: {wall:.0f} s for {len(runs)} runs; steps run per worker: {ran}")
    print(f"trained: {tokens:.3g} tokens, {flops:.3g} FLOPs: {tokens / wall:,.0f} tokens/s, {flops / wall:.3g} FLOP/s "
          "over the wall time (compilation, tokenization and evaluation included)\n")
    budgets = sorted({r.budget for r in runs if r.budget})
    largest = budgets[-1] if budgets else None
    png = prefix / "scaling.png"
    if analysis.isoflop is not None or analysis.parametric is not None:
        plot_scaling(runs, analysis.isoflop, analysis.parametric, str(png), title="IsoFLOP sweep on the TinyStories sample")
    print(report_text(analysis, [largest, 10 * largest] if largest else [], png=str(png)))
    if args.out:
        figures = {"machine": platform.node(), "cpu_count": os.cpu_count(), "workers": args.workers, "wall_s": wall,
                   "steps_per_worker": ran, "tokens": tokens, "flops": flops, "settings": settings,
                   **analysis.to_json([largest] if largest else [])}
        Path(args.out).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
