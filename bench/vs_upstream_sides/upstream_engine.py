"""Upstream's side of the engine comparison: ``steps`` trivial steps under one root, through its ``StepRunner``.

Runs in the upstream interpreter and imports only upstream's packages and the standard library.
The same DAG as our side's: ``steps`` independent steps that do nothing and one root that depends on
all of them, the runner given the root only; first run, then five reruns (each a fresh runner on the
DAG declared again), on one fresh prefix, with the runner's default concurrency. The root logger is
set up at WARNING first (upstream's runner would otherwise install INFO logging, a line per step).

Prints one JSON line: the seconds of the first run, the median seconds of the reruns, and the
number of steps.
"""

import argparse
import json
import logging
import os
import statistics
import tempfile
import time


RERUNS = 5  # as on our side: the median of five reruns, each a fresh runner on a freshly declared DAG


def nothing(output_path: str) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    with tempfile.TemporaryDirectory(prefix="upstream-engine-") as prefix:
        def dag() -> StepSpec:
            leaves = [StepSpec(name=f"bench/leaf{i:05d}", output_path_prefix=prefix, hash_attrs={"index": i}, fn=nothing)
                      for i in range(args.steps)]
            return StepSpec(name="bench/root", output_path_prefix=prefix, deps=leaves, fn=nothing)

        seconds = []
        for _ in range(1 + RERUNS):
            started = time.perf_counter()
            StepRunner().run([dag()])
            seconds.append(time.perf_counter() - started)
        written = sum(1 for entry in os.scandir(os.path.join(prefix, "bench")) if entry.is_dir())
        assert written == args.steps + 1, written
    print(json.dumps({"steps": args.steps + 1, "first_s": round(seconds[0], 4),
                      "rerun_s": round(statistics.median(seconds[1:]), 5)}))


if __name__ == "__main__":
    main()
