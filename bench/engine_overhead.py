"""Engine overhead: plan and skip a 1,000-step DAG whose steps are all already done.

Builds a layered DAG (each step depends on up to two steps of the previous layer), runs it once to
populate a temporary prefix, then measures on the all-cached DAG:

* ``plan_s``: building the specs, hashing them, and planning (one status read per step);
* ``skip_s``: a full ``StepRunner.run`` that finds every step cached and runs nothing;
* ``per_step_overhead_s``: ``skip_s`` divided by the number of steps.

Usage: ``python bench/engine_overhead.py [--steps 1000] [--prefix URL]``. The last line printed is
one JSON object with the figures; the target is ``plan_s + skip_s < 1`` for 1,000 steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time

from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec
from rigging.log import setup_logging

LAYER_WIDTH = 10


def noop() -> None:
    return None


def build_dag(count: int) -> list[StepSpec]:
    steps: list[StepSpec] = []
    for index in range(count):
        layer, position = divmod(index, LAYER_WIDTH)
        previous = steps[(layer - 1) * LAYER_WIDTH : layer * LAYER_WIDTH] if layer else []
        deps = [previous[position], previous[(position + 1) % len(previous)]] if previous else []
        steps.append(StepSpec(f"bench/layer{layer:04d}/step{position}", noop, deps=deps, hash_attrs={"index": index}))
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--prefix", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--log-level", default="WARNING", help="INFO shows one line per cached step (slower)")
    args = parser.parse_args()
    setup_logging(args.log_level)

    with tempfile.TemporaryDirectory() as scratch:
        prefix = args.prefix or os.path.join(scratch, "prefix")
        started = time.perf_counter()
        StepRunner(prefix=prefix).run(build_dag(args.steps))
        populate_s = time.perf_counter() - started
        logging.getLogger(__name__).warning("populated %d steps in %.2fs", args.steps, populate_s)

        started = time.perf_counter()
        runner = StepRunner(prefix=prefix)
        planned = runner.plan(build_dag(args.steps))
        plan_s = time.perf_counter() - started
        assert all(p.cached for p in planned), "every step should be cached after the first run"

        started = time.perf_counter()
        report = StepRunner(prefix=prefix).run(build_dag(args.steps))
        skip_s = time.perf_counter() - started
        assert len(report.cached) == args.steps and not report.ran

    figures = {
        "steps": args.steps,
        "plan_s": round(plan_s, 4),
        "skip_s": round(skip_s, 4),
        "total_s": round(plan_s + skip_s, 4),
        "per_step_overhead_s": round(skip_s / args.steps, 6),
        "populate_s": round(populate_s, 3),
        "log_level": args.log_level,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
