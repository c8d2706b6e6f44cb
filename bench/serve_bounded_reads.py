"""What ``marin serve`` reads to show a page of a huge file, next to reading that file whole.

    python bench/serve_bounded_reads.py              # a 300 MB one-line jsonl and a 300 MB log
    python bench/serve_bounded_reads.py --mb 50

Builds, in a throwaway prefix, a jsonl whose only record is ``--mb`` MB long and a replica log of
``--mb`` MB (one attempt of a step), then times through FastAPI's test client (no network) the
first page of the jsonl (``/api/data``) and the tail of the log (``/api/log``), with the Python
heap's peak while answering (tracemalloc). The peer, measured in the same run on the same files,
is the whole-file read each page used to do or would do without its bounds: ``json.loads`` of the
whole line, and ``read()`` of the whole log. Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

from fastapi.testclient import TestClient
from iris.attempt_log import AttemptLog, AttemptOutcome
from marin.serve.app import create_app


def measure(name: str, work: Callable[[], Any]) -> dict[str, Any]:
    tracemalloc.start()
    started = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"what": name, "seconds": round(seconds, 3), "peak_heap_mb": round(peak / 2**20, 1), "answer_bytes": result}


def build(root: Path, megabytes: int) -> None:
    chunk = "a" * (1 << 20)
    with open(root / "one-line.jsonl", "w") as handle:
        handle.write('{"text": "')
        for _ in range(megabytes):
            handle.write(chunk)
        handle.write('"}\n')
    step = root / "demo" / "step-0123abcd"
    step.mkdir(parents=True)
    (step / ".executor_status").write_text(json.dumps({"status": "SUCCESS", "time": time.time()}))
    attempt = AttemptLog.begin(str(step))
    line = b"x" * 99 + b"\n"
    block = line * ((1 << 20) // len(line))
    for _ in range(megabytes):
        attempt.append(0, block)
    attempt.finish(AttemptOutcome.SUCCEEDED, "", [0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mb", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, args.mb)
        client = TestClient(create_app(tmp))
        client.get("/api/steps")  # imports and first-request set-up, outside the measurements
        log = root / "demo" / "step-0123abcd" / ".attempts" / "001" / "replica-000.log"
        rows = [
            measure("jsonl first page (/api/data)",
                    lambda: len(client.get("/api/data", params={"path": "one-line.jsonl"}).content)),
            measure("peer: json.loads of the whole line",
                    lambda: len(json.dumps(json.loads(open(root / "one-line.jsonl", "rb").readline())))),
            measure("log tail (/api/log)",
                    lambda: len(client.get("/api/log", params={"path": "demo/step-0123abcd", "attempt": 1}).content)),
            measure("peer: read() of the whole log", lambda: len(log.read_bytes().decode())),
        ]
        for row in rows:
            print(json.dumps({"file_mb": args.mb, **row}))


if __name__ == "__main__":
    main()
