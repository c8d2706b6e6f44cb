"""Reading a step's small records: the cost of refusing special files and bounding the read.

Every status and info record the runner, ``marin status`` and ``marin serve`` read goes through
:func:`rigging.regular_files.read_bounded_text` (stat, non-blocking open, fstat, a bounded read),
and the web view's also through a check that it stays inside the prefix. Measured per read of a
small ``.executor_status`` on local disk, against a plain ``fsx.read_text``:

* ``read_text_us``: ``fsx.read_text`` (no checks: what the readers used before);
* ``bounded_us``: ``read_bounded_text``;
* ``bounded_within_us``: ``read_bounded_text(within=prefix)``, as the web view reads.

Then ``list_rows_s``: the web view's step list over ``--steps`` step folders (two records each).

Usage: ``python bench/record_reads.py [--reads 5000] [--steps 1000]``. The last line printed is one
JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from rigging import filesystem as fsx
from rigging.regular_files import read_bounded_text


def per_read_us(read, reads: int) -> float:
    read()
    start = time.perf_counter()
    for _ in range(reads):
        read()
    return (time.perf_counter() - start) / reads * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reads", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    prefix = tempfile.mkdtemp(prefix="bench-records-")
    status = json.dumps({"status": "SUCCESS", "time": time.time()})
    for index in range(args.steps):
        folder = os.path.join(prefix, "steps", f"step{index}-{index:08x}")
        fsx.atomic_write(fsx.join(folder, ".executor_info"), json.dumps({"name": f"steps/step{index}"}))
        fsx.atomic_write(fsx.join(folder, ".executor_status"), status)
    record = os.path.join(prefix, "steps", "step0-00000000", ".executor_status")
    figures = {
        "read_text_us": per_read_us(lambda: fsx.read_text(record), args.reads),
        "bounded_us": per_read_us(lambda: read_bounded_text(record), args.reads),
        "bounded_within_us": per_read_us(lambda: read_bounded_text(record, within=prefix), args.reads),
    }
    from marin.serve.steps import list_rows

    list_rows(prefix)
    start = time.perf_counter()
    rows = list_rows(prefix)
    figures["list_rows_s"] = time.perf_counter() - start
    assert len(rows) == args.steps
    for name, value in figures.items():
        print(f"{name:>18}: {value:.1f}" if name.endswith("_us") else f"{name:>18}: {value:.3f}")
    print(json.dumps({**figures, "steps": args.steps}))


if __name__ == "__main__":
    main()
