"""How long ``marin serve``'s step list JSON (``/api/steps``) takes on a prefix of many steps.

    python bench/serve_step_list.py                 # 2,000 step folders, status files only
    python bench/serve_step_list.py --steps 10000

Builds a throwaway local prefix of ``--steps`` folders (``<group>/<name>-<hash>``, each holding only
``.executor_status``, a mix of statuses), then times ``GET /api/steps`` through FastAPI's test
client (the application's own work: the walk, the reads, the JSON; no network). Prints the median
of ``--repeats`` requests after one warm-up request, and the slowest. The target is under 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient
from marin.serve.app import create_app

STATUSES = ("SUCCESS", "SUCCESS", "SUCCESS", "FAILED", "RUNNING", "DEP_FAILED")


def build_prefix(root: Path, steps: int) -> None:
    for i in range(steps):
        folder = root / f"group-{i % 20:02d}" / f"step-{i:05d}-{i:08x}"
        folder.mkdir(parents=True)
        (folder / ".executor_status").write_text(json.dumps({"status": STATUSES[i % len(STATUSES)], "time": time.time() - i}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        build_prefix(Path(tmp), args.steps)
        print(f"built {args.steps:,} step folders in {time.perf_counter() - started:.2f}s")
        client = TestClient(create_app(tmp))
        first = client.get("/api/steps")
        assert first.status_code == 200 and len(first.json()["steps"]) == args.steps, first.text[:200]
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            response = client.get("/api/steps")
            times.append(time.perf_counter() - started)
            assert response.status_code == 200
        median, worst = statistics.median(times), max(times)
        verdict = "OK (< 1 s)" if worst < 1.0 else "TOO SLOW (target < 1 s)"
        print(f"/api/steps with {args.steps:,} steps: median {median:.3f}s, slowest {worst:.3f}s "
              f"({len(response.content) / 1024:.0f} KiB) {verdict}")


if __name__ == "__main__":
    main()
