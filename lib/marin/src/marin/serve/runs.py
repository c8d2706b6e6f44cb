"""Training runs and evaluations: curves from ``metrics.jsonl``, scores from ``eval.json`` and eval steps.

A training run is any step folder holding a ``metrics.jsonl``. Curves keep every step up to
:data:`MAX_POINTS` points per series; longer runs are thinned to every n-th point (the last point
is always kept), which a chart a few hundred pixels wide cannot tell apart. Files are opened only
when they are regular files inside the prefix, and read in bounded amounts: a metrics line longer
than :data:`MAX_LINE_BYTES` (no metrics record is) is skipped, and the model card shown is cut at
:data:`CARD_BYTES`.
"""

from __future__ import annotations

import bisect
import json
import math
from typing import Any

from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError, open_regular

from marin.execution.records.executor_files import ARTIFACT_FILE, STATUS_FILE
from marin.execution.ownership.step_ownership import staging_generation
from marin.serve.errors import NotFoundError, UnreadableError
from marin.serve.paths import resolve
from marin.serve.steps import StepRow, read_json_file

MAX_POINTS = 2000
MAX_LINE_BYTES = 1 << 20
READ_CHUNK_BYTES = 64 * 1024
CARD_BYTES = 256 * 1024
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.json"
CARD_FILE = "MODEL_CARD.md"

TOKENS_KEY = "tokens"  # the trainer's running count of tokens trained on, logged with each step

LEARNING_RATE_CHART = "learning rate"
# (chart title, how a metrics record names it, y axis title). Validation losses are every ``eval/<set>/loss``.
CHARTS = (
    ("loss", "loss", "training loss"),
    ("validation loss", "eval/*/loss", "validation loss"),
    ("lm-eval-harness", "harness/*", "metric (per task)"),  # train_lm(evals=...): harness/<task>/<metric>
    (LEARNING_RATE_CHART, "lr", "learning rate"),
    ("tokens/s", "tokens_per_second", "tokens per second"),
    ("MFU", "mfu", "model FLOPs utilisation"),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _lines(raw: Any) -> Any:
    """The file's lines, read in chunks; a line longer than :data:`MAX_LINE_BYTES` is passed over, never held."""
    pending, skipping = bytearray(), False
    while chunk := raw.read(READ_CHUNK_BYTES):
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            if not skipping and len(pending) + newline - start <= MAX_LINE_BYTES:
                yield bytes(pending + chunk[start:newline])
            pending, skipping, start = bytearray(), False, newline + 1
        if not skipping:
            pending += chunk[start:]
            if len(pending) > MAX_LINE_BYTES:
                pending, skipping = bytearray(), True
    if pending and not skipping:
        yield bytes(pending)


def read_series(metrics_url: str, within: str | None = None) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value)]}`` for every numeric metric, read line by line (damaged lines skipped)."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open_regular(metrics_url, within=within) as raw:
        for line in _lines(raw):
            try:
                record = json.loads(line.decode("utf-8", errors="replace"))
            except ValueError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
            for key, value in record.items():
                number = _number(value)
                if key != "step" and number is not None:
                    series.setdefault(key, []).append((record["step"], number))
    return {key: thin(points) for key, points in series.items()}


def thin(points: list[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    kept = points[::stride]
    return kept if kept[-1] == points[-1] else kept + [points[-1]]


def chart_series(series: dict[str, list[tuple[int, float]]], pattern: str) -> dict[str, list[tuple[int, float]]]:
    """The series a chart pattern names (``eval/*/loss`` matches each validation set)."""
    if "*" not in pattern:
        return {pattern: series[pattern]} if pattern in series else {}
    head, tail = pattern.split("*", 1)
    return {key[len(head) : len(key) - len(tail)]: points for key, points in series.items()
            if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail)}


def by_tokens(series: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[float, float]]]:
    """The same series with x the tokens trained on by that step.

    A step without its own count (an evaluation logged apart, or a point the thinning kept for one
    series and not the other) gets the count interpolated between its neighbours; steps outside
    the counted range are left out rather than guessed.
    """
    counted = series.get(TOKENS_KEY, [])
    steps = [step for step, _ in counted]

    def tokens_at(step: int) -> float | None:
        index = bisect.bisect_left(steps, step)
        if index < len(steps) and steps[index] == step:
            return counted[index][1]
        if index == 0 or index == len(steps):
            return None
        (s0, t0), (s1, t1) = counted[index - 1], counted[index]
        return t0 + (t1 - t0) * (step - s0) / (s1 - s0)

    out: dict[str, list[tuple[float, float]]] = {}
    for key, points in series.items():
        mapped = [(tokens_at(step), value) for step, value in points]
        out[key] = [(x, value) for x, value in mapped if x is not None]
    return out


def final_metrics(series: dict[str, list[tuple[int, float]]]) -> dict[str, float]:
    """Each chart's last value (validation losses one per set), plus the last step and token count;
    for the learning rate, its peak: the decayed rate a run ends on says nothing of what it trained with."""
    final = {"steps": float(series["loss"][-1][0])} if series.get("loss") else {}
    if series.get(TOKENS_KEY):
        final["tokens"] = series[TOKENS_KEY][-1][1]
    for title, pattern, _ in CHARTS:
        for label, points in chart_series(series, pattern).items():
            if not points:
                continue
            if title == LEARNING_RATE_CHART:
                final[f"peak {title}"] = max(value for _, value in points)
            else:
                final[title if "*" not in pattern else pattern.replace("*", label).removeprefix("eval/").replace("/", " ")] = points[-1][1]
    return final


def _metrics_url(prefix: str, path: str) -> str | None:
    """The step's committed ``metrics.jsonl``; while it trains (or after it stopped short), the one in
    the staging folder its status record names, where the running execution writes."""
    url = resolve(prefix, f"{path}/{METRICS_FILE}")
    if fsx.exists(url):
        return url
    try:
        status = read_json_file(resolve(prefix, f"{path}/{STATUS_FILE}"), prefix)
    except UnreadableError:
        return None
    staging = status.get("staging") if isinstance(status, dict) and status.get("status") != "SUCCESS" else None
    if not isinstance(staging, str) or staging_generation(staging) is None:
        return None
    url = resolve(prefix, f"{path}/{staging}/{METRICS_FILE}")
    return url if fsx.exists(url) else None


def is_training_run(prefix: str, row: StepRow) -> bool:
    return _metrics_url(prefix, row.path) is not None


def run_metrics(prefix: str, path: str) -> dict[str, list[tuple[int, float]]]:
    url = _metrics_url(prefix, path)
    if url is None:
        raise NotFoundError(f"{path!r} has no {METRICS_FILE}: it is not a training run")
    try:
        return read_series(url, prefix)
    except RefusedFileError as exc:
        raise UnreadableError(str(exc)) from exc


def run_extras(prefix: str, path: str) -> dict[str, Any]:
    """Samples (from the step's result) and the model card, when there are any."""
    artifact = read_json_file(resolve(prefix, f"{path}/{ARTIFACT_FILE}"), prefix) or {}
    result = artifact.get("result") if isinstance(artifact, dict) else None
    samples = result.get("samples") if isinstance(result, dict) else None
    try:
        with open_regular(resolve(prefix, f"{path}/{CARD_FILE}"), within=prefix) as handle:
            card = handle.read(CARD_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        card = None
    except RefusedFileError as exc:
        card = f"({exc})"
    return {"samples": [str(s) for s in samples] if isinstance(samples, list) else [], "model_card": card}


def evaluation_table(prefix: str, rows: list[StepRow]) -> tuple[list[str], dict[str, dict[str, float]]]:
    """``(model columns, {metric row: {model: value}})`` from eval steps' results and training ``eval.json``.

    Eval steps (results with per-dataset ``loss``/``perplexity``/``bits_per_byte``) are named by the
    model they evaluated; a training run's own ``eval.json`` by its step.
    """
    table: dict[str, dict[str, float]] = {}
    columns: list[str] = []

    def put(model: str, metric: str, value: Any) -> None:
        number = _number(value)
        if number is None:
            return
        if model not in columns:
            columns.append(model)
        table.setdefault(metric, {})[model] = number

    for row in rows:
        folder = fsx.join(prefix, row.path)
        try:
            artifact = read_json_file(fsx.join(folder, ARTIFACT_FILE), prefix)
        except Exception:  # noqa: BLE001 - one damaged record must not hide every other model's scores
            artifact = None
        result = artifact.get("result") if isinstance(artifact, dict) else None
        if isinstance(result, dict) and isinstance(result.get("datasets"), dict) and "model" in result:
            model = f"{result['model']} ({row.short_hash})"
            for dataset, score in result["datasets"].items():
                if isinstance(score, dict):
                    for metric in ("loss", "perplexity", "bits_per_byte"):
                        put(model, f"{dataset} {metric}", score.get(metric))
        try:
            evaluation = read_json_file(fsx.join(folder, EVAL_FILE), prefix)
        except Exception:  # noqa: BLE001
            evaluation = None
        if isinstance(evaluation, dict):
            model = f"{row.name} ({row.short_hash})"
            put(model, "train loss", evaluation.get("train_loss"))
            for dataset, loss in (evaluation.get("eval") or {}).items():
                put(model, f"{dataset} loss", loss)
    return columns, table
