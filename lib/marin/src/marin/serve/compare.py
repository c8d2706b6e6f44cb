"""Runs side by side: what each run was trained with, the settings that differ between them, and
each run's final metrics, in that order (the columns a person reads first come first).

The first columns name each run's optimizer and its peak learning rates (as
:mod:`marin.experiment.describe` words them), since comparing optimizers is what runs side by side
are most often for. Then the settings, as ``marin explain A B`` compares them: the step's version,
each flattened hash attribute (``optimizer.weight_decay``) and each dependency's identity, read from
the ``.executor_info`` the runner recorded. Only those that differ are kept (the optimizer's first),
so the table shows what was changed, not the hundred things that were not. Last, the final
metrics, where the learning rate is the peak the run reached, not the decayed rate it ended on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin.execution.records.executor_files import CorruptRecordError, read_info
from marin.execution.reproducibility.explain import identity_settings
from marin.experiment.describe import peak_rates, rates_text
from marin.serve.paths import resolve
from marin.serve.runs import final_metrics

MISSING = object()  # a setting one run has and another lacks differs from every value
OPTIMIZER = "hash_attrs.optimizer."
LEADING = ("optimizer", "peak learning rate")


@dataclass(frozen=True)
class Comparison:
    runs: list[str]  # paths, in the order selected
    metrics: list[str]  # final metric names, in chart order
    settings: list[str]  # only the ones that differ, the optimizer's first
    values: dict[str, dict[str, Any]]  # run path -> {leading column, metric or setting: value}
    leading: tuple[str, ...] = LEADING


def run_settings(prefix: str, path: str) -> dict[str, Any]:
    """A run's identity inputs, flattened as ``marin explain`` flattens them."""
    try:
        info = read_info(resolve(prefix, path), strict=True, within=prefix) or {}
    except CorruptRecordError:
        return {}
    return identity_settings(info)


def _optimizer_record(settings: dict[str, Any]) -> dict[str, Any]:
    return {key.removeprefix(OPTIMIZER): value for key, value in settings.items() if key.startswith(OPTIMIZER)}


def _leading(settings: dict[str, Any], final: dict[str, float]) -> dict[str, Any]:
    """The optimizer's name and peak rates from the run's hashed config; without one (a run declared
    outside ``train_lm``), the peak of its logged learning rate."""
    record = _optimizer_record(settings)
    peak = rates_text(record) if peak_rates(record) else final.get("peak learning rate")
    return {"optimizer": record.get("type") or "-", "peak learning rate": peak}


def compare_runs(prefix: str, paths: list[str], series_by_run: dict[str, dict]) -> Comparison:
    finals = {path: final_metrics(series_by_run.get(path, {})) for path in paths}
    settings = {path: run_settings(prefix, path) for path in paths}
    metrics: list[str] = []
    for final in finals.values():
        metrics.extend(key for key in final if key not in metrics and key != "peak learning rate")
    shown_first = {f"{OPTIMIZER}type", *(f"{OPTIMIZER}{name}" for s in settings.values() for name in peak_rates(_optimizer_record(s)))}
    keys = sorted({key for values in settings.values() for key in values} - shown_first,
                  key=lambda key: (not key.startswith(OPTIMIZER), key))
    differing = [key for key in keys if len({repr(settings[p].get(key, MISSING)) for p in paths}) > 1]
    values = {path: {**finals[path], **_leading(settings[path], finals[path]),
                     **{key: settings[path].get(key) for key in differing}} for path in paths}
    return Comparison(paths, metrics, differing, values)
