"""What keeping a step's output in its attempt log costs, next to printing the same without it.

    python bench/log_capture.py [--old-tree PATH] [--cases short-1e5,short-1e6,long-4MiB]

For each case a step prints to stdout (sent to /dev/null, so the terminal costs nothing):

* ``short-1e5``, ``short-1e6``: ``print(i)`` for 10^5 or 10^6 numbers;
* ``long-4MiB``: 256 lines of 16 KiB each.

and the bench prints seconds, side by side:

* ``bare_s``: the same loop called directly, nothing captured;
* ``captured_s``: the step run by a ``StepRunner`` on a local prefix (its thread's output copied
  into ``<step>/.attempts/001/replica-000.log``), less what an empty step costs the same runner
  once it has run one (so the figure is the printing and its capture, not the runner's start-up);
* ``old_s`` (with ``--old-tree``): ``captured_s`` with the code of another checkout of this
  repository (``git worktree add /tmp/old HEAD``), for comparing before and after a change.

Each figure comes from a fresh Python process, so the old and new code never share one. A known
secret value is set in the environment, so redaction is part of what is measured. The last line
printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {"short-1e5": ("short", 100_000), "short-1e6": ("short", 1_000_000), "long-4MiB": ("long", 256)}
LONG_LINE = "x" * (16 * 1024 - 1)
LIBRARIES = ("fray", "haliax", "iris", "levanter", "marin", "rigging", "zephyr")
SECRET_ENV = {"WANDB_API_KEY": "bench-secret-value-0123456789"}


def prints(kind: str, count: int) -> None:
    if kind == "short":
        for i in range(count):
            print(i)
    else:
        for _ in range(count):
            print(LONG_LINE)


def _silenced(call):
    """``call()``'s seconds with stdout sent to /dev/null."""
    real = sys.stdout
    with open(os.devnull, "w") as sink:
        sys.stdout = sink
        try:
            started = time.perf_counter()
            call()
            return time.perf_counter() - started
        finally:
            sys.stdout = real


def measure(case: str, mode: str) -> float:
    """Seconds for one case, in this process: ``bare`` or ``captured``."""
    kind, count = CASES[case]
    if mode == "bare":
        return _silenced(lambda: prints(kind, count))
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec
    from rigging.log import setup_logging

    setup_logging("WARNING")
    with tempfile.TemporaryDirectory() as prefix:
        def run(name, fn):
            return _silenced(lambda: StepRunner(prefix=prefix).run([StepSpec(name, fn)]))

        run("warm-up", lambda output_path: None)  # the runner's first step pays for imports and thread pools
        printing_s = run("printing", lambda output_path: prints(kind, count))
        empty_s = run("empty", lambda output_path: None)
        log = next(Path(prefix).glob("printing-*/.attempts/001/replica-000.log"))
        expected = count * (len(LONG_LINE) + 1) if kind == "long" else sum(len(str(i)) + 1 for i in range(count))
        assert log.stat().st_size == expected, f"{log} holds {log.stat().st_size} bytes, not {expected}"
    return printing_s - empty_s


def in_child(case: str, mode: str, tree: str | None) -> float:
    """:func:`measure` in a fresh process; with ``tree``, importing the libraries of that checkout."""
    env = {**os.environ, **SECRET_ENV}
    if tree is not None:
        sources = [str(Path(tree) / "lib" / name / "src") for name in LIBRARIES]
        env["PYTHONPATH"] = os.pathsep.join(sources + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, __file__, "--child", case, mode], env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} run of {case} failed{' in ' + tree if tree else ''}:\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-tree", default=None, help="another checkout to measure the captured runs with")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(measure(*args.child))
        return

    figures = {}
    print(f"{'case':<12}{'bare_s':>10}{'captured_s':>12}{'old_s':>10}")
    for case in args.cases.split(","):
        row = {"bare_s": in_child(case, "bare", None), "captured_s": in_child(case, "captured", None)}
        if args.old_tree:
            row["old_s"] = in_child(case, "captured", args.old_tree)
        figures[case] = {key: round(value, 3) for key, value in row.items()}
        old = f"{row['old_s']:>10.3f}" if "old_s" in row else f"{'-':>10}"
        print(f"{case:<12}{row['bare_s']:>10.3f}{row['captured_s']:>12.3f}{old}", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
