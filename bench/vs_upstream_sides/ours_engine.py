"""Our side of the engine comparison: ``steps`` trivial steps under one root, through our ``StepRunner``.

The DAG is ``steps`` independent steps that do nothing (each with its own hash attribute) and one
root step that depends on all of them; the runner is given the root only and finds the rest. It
runs on one fresh prefix with the runner's default concurrency: first (every step runs), then five
times more, each a fresh runner on the DAG declared again (the root is done, so nothing it was made
from is needed). Logging is at WARNING, as on upstream's side.

Prints one JSON line: the seconds of the first run, the median seconds of the reruns, and the
number of steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec
from rigging.log import setup_logging


RERUNS = 5  # a rerun takes milliseconds: the median of five, each a fresh runner on a freshly declared DAG


def nothing() -> None:
    return None


def dag(count: int) -> StepSpec:
    leaves = [StepSpec(f"bench/leaf{i:05d}", nothing, hash_attrs={"index": i}) for i in range(count)]
    return StepSpec("bench/root", nothing, deps=leaves)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args(argv)
    setup_logging("WARNING")
    with tempfile.TemporaryDirectory(prefix="ours-engine-") as prefix:
        seconds = []
        for run in range(1 + RERUNS):
            started = time.perf_counter()
            report = StepRunner(prefix=prefix).run([dag(args.steps)])
            seconds.append(time.perf_counter() - started)
            # A rerun reads the finished root only: the steps it was made from are not needed.
            done = report.cached + report.not_needed if run else report.ran
            assert len(done) == args.steps + 1, (run, len(report.ran), len(report.cached), len(report.not_needed))
            del report  # not kept through the next run (upstream's runner returns nothing to keep)
    print(json.dumps({"steps": args.steps + 1, "first_s": round(seconds[0], 4),
                      "rerun_s": round(statistics.median(seconds[1:]), 5)}))


if __name__ == "__main__":
    main()
