"""What it costs to place a step through iris, next to running it in the runner's own process.

    python bench/iris_step_overhead.py [--steps 5]

Runs the same trivial steps (each writes one small file and returns) one after another under four
placements and prints seconds per step, side by side:

* in-process: the default, each step in a thread of the runner;
* iris:local: each step an iris job whose replica is a child process of its supervisor;
* iris:slurm: each step an iris job on a private one-node Slurm started for the bench
  (fray.cluster.slurm_local; needs slurm-wlm, munge and root);
* iris:ray: each step an iris job on a private one-node Ray cluster started for the bench.

A step through iris pays for a supervisor process, the engine's placement (sbatch and Slurm's
scheduling, a Ray actor), a fresh Python process that imports Marin and the step's code, and the
runner's polling (0.5 s). The figures are for a machine where all of it runs locally; on a real
cluster the engine's queue adds its own wait.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack

from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec
from rigging.log import setup_logging


def touch(output_path: str) -> int:
    with open(os.path.join(output_path, "done.txt"), "w") as handle:
        handle.write("done")
    return 1


def seconds_per_step(cluster: str | None, steps: int, env: dict[str, str]) -> list[float]:
    """Wall seconds of each step, run one at a time (separate runs, so nothing overlaps)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        prefix = tempfile.mkdtemp(prefix="iris-bench-")
        os.environ["IRIS_HOME"] = os.path.join(prefix, ".iris")
        times = []
        for index in range(steps):
            step = StepSpec(f"bench/touch-{index}", touch, hash_attrs={"cluster": cluster or "in-process"})
            started = time.perf_counter()
            StepRunner(prefix=prefix, cluster=cluster).run([step])
            times.append(time.perf_counter() - started)
        return times
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    setup_logging("WARNING")
    rows = []
    with ExitStack() as stack:
        placements: list[tuple[str, str | None, dict[str, str]]] = [("in-process", None, {}), ("iris:local", "iris:local", {})]
        from fray.cluster.slurm_local import LocalSlurmCluster, missing_slurm

        reason = missing_slurm()
        if reason is None:
            slurm = stack.enter_context(LocalSlurmCluster())
            placements.append(("iris:slurm", "iris:slurm", dict(slurm.env)))
        else:
            print(f"iris:slurm skipped: {reason}", file=sys.stderr)
        try:
            from fray.cluster.ray_nodes import LocalRayCluster

            ray_nodes = stack.enter_context(LocalRayCluster())
            ray_nodes.start_head("head", cpus=2)
            placements.append(("iris:ray", "iris:ray", {**ray_nodes.env, **ray_nodes.driver_env}))
        except Exception as exc:  # noqa: BLE001 - Ray is an optional extra
            print(f"iris:ray skipped: {exc}", file=sys.stderr)
        for label, cluster, env in placements:
            times = seconds_per_step(cluster, args.steps, env)
            rows.append({"placement": label, "steps": len(times), "median_s": statistics.median(times),
                         "min_s": min(times), "max_s": max(times)})
    baseline = rows[0]["median_s"]
    print(f"{'placement':<12} {'s/step (median)':>16} {'min':>7} {'max':>7} {'x in-process':>13}")
    for row in rows:
        print(f"{row['placement']:<12} {row['median_s']:>16.2f} {row['min_s']:>7.2f} {row['max_s']:>7.2f} "
              f"{row['median_s'] / baseline:>13.1f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
