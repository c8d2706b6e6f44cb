"""Run bench scripts against this working tree's libraries and an earlier revision's, alternately.

A change that claims "no slower" needs both figures from the same machine at the same time: this
script exports ``--base`` (a git revision) into a temporary folder, then runs each bench script
(this tree's copy, so both sides are measured the same way) ``--rounds`` times with each tree's
libraries in turn (base, this tree, base, ...), so drift of the machine (other work, thermal
state, caches) falls on both alike. Each bench script prints one JSON object
as its last line; every number in it is reported as the median over rounds for both trees, with
their ratio.

Usage: ``python bench/side_by_side.py --base HEAD bench/engine_overhead.py bench/tokenize_throughput.py``
(arguments after ``--`` go to every bench script). The last line printed is one JSON object with
the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_revision(revision: str, into: Path) -> Path:
    """The tree of ``revision`` as plain files under ``into`` (``git archive``: no checkout is touched)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision],
                             check=True, capture_output=True, timeout=300).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=300)
    return into


def python_path(tree: Path) -> str:
    """The tree's packages first on the path: its ``lib/*/src`` folders and its root (``experiments``)."""
    return os.pathsep.join([*(str(p) for p in sorted((tree / "lib").glob("*/src"))), str(tree)])


def run_once(tree: Path, script: str, args: list[str], timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": python_path(tree)}
    done = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed with the libraries of {tree} (exit {done.returncode}):\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith("{")]
    if not lines:
        raise SystemExit(f"{script} printed no JSON line in {tree}:\n{done.stdout[-2000:]}")
    return json.loads(lines[-1])


def numbers(record: dict, prefix: str = "") -> dict[str, float]:
    """Every number of a (nested) JSON object, by dotted key."""
    found: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            found[prefix + key] = float(value)
        elif isinstance(value, dict):
            found.update(numbers(value, f"{prefix}{key}."))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="+", help="bench scripts, relative to the repository root")
    parser.add_argument("--base", default="HEAD", help="the git revision to compare with (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per bench run")
    argv = sys.argv[1:]
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    summary: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as scratch:
        base = export_revision(args.base, Path(scratch))
        trees = {"base": base, "this": ROOT}
        for script in args.scripts:
            runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
            for round_index in range(args.rounds):
                for label, tree in trees.items():
                    record = numbers(run_once(tree, script, passthrough, args.timeout))
                    runs[label].append(record)
                    print(f"{script} round {round_index + 1} {label}: {json.dumps(record)}", flush=True)
            keys = [key for key in runs["this"][0] if all(key in r for r in runs["base"] + runs["this"])]
            medians = {label: {key: statistics.median(r[key] for r in runs[label]) for key in keys} for label in runs}
            print(f"\n{script} (median of {args.rounds}; base = {args.base})")
            print(f"  {'figure':<32} {'base':>14} {'this tree':>14} {'this/base':>10}")
            for key in keys:
                before, after = medians["base"][key], medians["this"][key]
                ratio = after / before if before else float("nan")
                print(f"  {key:<32} {before:>14.4g} {after:>14.4g} {ratio:>10.3f}")
            summary[script] = medians
    print(json.dumps({"base": args.base, "rounds": args.rounds, "medians": summary}))


if __name__ == "__main__":
    main()
