"""A real small IsoFLOP sweep on the TinyStories sample, shared by several workers, then the scaling fits.

    python bench/scaling_sweep.py                    # the script's sweep: 16 runs, 7.3e12 FLOPs, two workers
    python bench/scaling_sweep.py --workers 1 --prefix /tmp/scaling   # one worker; keep the outputs there
    python bench/scaling_sweep.py --tiny             # 9 runs of a few steps (smoke check, about a minute)
    python bench/scaling_sweep.py --prefix /tmp/scaling --screenshot docs/images/serve-scaling.png   # and /scaling's picture

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
writes one JSON object with the same figures, and ``--screenshot PNG`` takes ``marin serve``'s
``/scaling`` page of the sweep with headless Chromium (``scripts/install_browser.sh``), as
docs/browser.md shows it. A rerun on the same prefix finds every run cached.
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
    parser.add_argument("--screenshot", metavar="PNG", help="also take /scaling's screenshot there (headless Chromium)")
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
    if args.screenshot:
        screenshot_scaling_page(str(prefix), STEPS, args.screenshot)
        print(f"/scaling's screenshot written to {args.screenshot}")
    return 0


def screenshot_scaling_page(prefix: str, steps: str, png: str) -> None:
    """``marin serve``'s /scaling of the sweep, whole, in a 1280-pixel-wide headless Chromium."""
    import shutil
    import socket
    import threading
    from urllib.parse import quote

    import uvicorn
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    from marin.serve.app import create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(prefix), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    options = Options()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.set_page_load_timeout(300)
        driver.get(f"http://127.0.0.1:{port}/scaling?steps={quote(steps)}")
        driver.set_window_size(1280, driver.execute_script("return document.body.scrollHeight") + 40)
        driver.save_screenshot(png)
    finally:
        driver.quit()
        server.should_exit = True


if __name__ == "__main__":
    sys.exit(main())
