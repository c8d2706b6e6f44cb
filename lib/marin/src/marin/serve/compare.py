"""Runs side by side: each selected run's final metrics and only the settings that differ between them.

A setting is what ``marin explain A B`` compares: the step's version, each flattened hash
attribute (``optimizer.learning_rate``) and each dependency's identity, all read from the
``.executor_info`` the runner recorded. Settings equal in every selected run are left out, so the
table shows what was changed, not the hundred things that were not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin.execution.executor_files import CorruptRecordError, read_info
from marin.execution.explain import identity_settings
from marin.serve.paths import resolve
from marin.serve.runs import final_metrics

MISSING = object()  # a setting one run has and another lacks differs from every value


@dataclass(frozen=True)
class Comparison:
    runs: list[str]  # paths, in the order selected
    metrics: list[str]  # final metric names, in chart order
    settings: list[str]  # only the ones that differ
    values: dict[str, dict[str, Any]]  # run path -> {metric or setting: value}


def run_settings(prefix: str, path: str) -> dict[str, Any]:
    """A run's identity inputs, flattened as ``marin explain`` flattens them."""
    try:
        info = read_info(resolve(prefix, path), strict=True, within=prefix) or {}
    except CorruptRecordError:
        return {}
    return identity_settings(info)


def compare_runs(prefix: str, paths: list[str], series_by_run: dict[str, dict]) -> Comparison:
    finals = {path: final_metrics(series_by_run.get(path, {})) for path in paths}
    settings = {path: run_settings(prefix, path) for path in paths}
    metrics: list[str] = []
    for final in finals.values():
        metrics.extend(key for key in final if key not in metrics)
    keys = sorted({key for values in settings.values() for key in values})
    differing = [key for key in keys if len({repr(settings[p].get(key, MISSING)) for p in paths}) > 1]
    values = {path: {**finals[path], **{key: settings[path].get(key) for key in differing}} for path in paths}
    return Comparison(paths, metrics, differing, values)
