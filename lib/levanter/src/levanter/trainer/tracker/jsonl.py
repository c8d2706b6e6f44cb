"""``metrics.jsonl``: one JSON object per line, always on, the record every other tool reads."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping


def _plain(value: Any) -> Any:
    # NaN/inf are not JSON; writing null keeps every line parseable by strict readers.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlTracker:
    """Appends to ``path`` (a resumed run continues the same file) and flushes each line, so a
    killed run leaves every completed step on disk."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        pass  # the summary goes to eval.json / the run's result, not into the per-step stream

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
