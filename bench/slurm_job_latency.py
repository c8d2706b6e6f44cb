"""Submit-to-start latency of a Slurm job, next to a local process job, measured in one run.

Starts a private single-node Slurm (``fray.cluster.slurm_local``; needs Slurm and root), then for
``--jobs`` tiny jobs, one after another, on each client:

* ``start_s``: from ``submit()`` to the command's first line (its wall-clock time, printed by the
  command itself; both clients run it on this machine, so the clocks agree);
* ``done_s``: from ``submit()`` to the handle reporting SUCCEEDED (includes the client's polling);

Usage: ``python bench/slurm_job_latency.py [--jobs 5]``. Prints the cluster's start-up time, one
line per client (median and max of each figure), then one JSON object with them all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

from fray.cluster import JobRequest, JobStatus, LocalClient, ResourceConfig
from fray.cluster.slurm_client import SlurmClient
from fray.cluster.slurm_local import LocalSlurmCluster, missing_slurm

COMMAND = [sys.executable, "-I", "-c", "import time; print(repr(time.time()), flush=True)"]


def measure(client, jobs: int) -> dict[str, float]:
    starts, dones = [], []
    for index in range(jobs):
        submitted = time.time()
        handle = client.submit(JobRequest(f"latency-{index}", COMMAND, resources=ResourceConfig.with_cpu(ram="64m")))
        if handle.wait(timeout=120) != JobStatus.SUCCEEDED:
            raise SystemExit(f"job {index} ended {handle.status()}: {handle.logs()}")
        dones.append(time.time() - submitted)
        starts.append(float(handle.logs().split()[0]) - submitted)
        handle.release()
    return {"start_s_median": statistics.median(starts), "start_s_max": max(starts),
            "done_s_median": statistics.median(dones), "done_s_max": max(dones)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5)
    args = parser.parse_args()
    reason = missing_slurm()
    if reason is not None:
        raise SystemExit(reason)
    with tempfile.TemporaryDirectory() as root, LocalSlurmCluster() as cluster:
        print(f"local Slurm up in {cluster.startup_s:.2f} s")
        figures = {"slurm_startup_s": cluster.startup_s,
                   "slurm": measure(SlurmClient(job_root=root, poll_interval_s=0.2), args.jobs),
                   "local": measure(LocalClient(), args.jobs)}
    for name in ("slurm", "local"):
        row = figures[name]
        print(f"{name:6s} submit->start median {row['start_s_median']:.3f} s (max {row['start_s_max']:.3f}), "
              f"submit->SUCCEEDED median {row['done_s_median']:.3f} s (max {row['done_s_max']:.3f})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
