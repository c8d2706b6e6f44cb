"""The body of a harness eval step: run lm-eval-harness tasks on one model and keep their metrics.

``lm_eval`` is imported only when a step runs (it is an optional dependency, the ``eval`` extra).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from marin.errors import MarinError
from marin.evaluation.model_source import LoadedModel
from marin.execution.artifact import register_result_type

logger = logging.getLogger(__name__)


class HarnessConfigError(MarinError, ValueError):
    """A harness evaluation that cannot run as declared (no tasks, unknown task, bad limit)."""


@register_result_type
@dataclass(frozen=True)
class HarnessResults:
    """The result of an ``evaluate_harness`` step: per task, its metrics (``acc``, ``acc_stderr``, ...).

    ``tasks`` maps a task name to ``{metric: value}``, metric names without lm-eval's ``,none``
    filter suffix (other filters keep theirs); ``samples`` is how many documents each task scored.
    """

    model: str
    model_identity: str
    model_path: str
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    num_fewshot: int | None = None
    limit: int | None = None
    max_seq_len: int = 0
    lm_eval_version: str = ""
    eval_seconds: float = 0.0

    def summary(self) -> str:
        """A table of every task's metrics (printed by the runner when the step is a final step)."""
        lines = [f"lm-eval-harness on {self.model} (weights at {self.model_path}), "
                 f"max_seq_len {self.max_seq_len}, in {self.eval_seconds:.0f} s (lm_eval {self.lm_eval_version})."]
        width = max([len("task")] + [len(name) for name in self.tasks])
        lines.append(f"  {'task':<{width}}  {'metric':<16}  {'value':>8}  {'stderr':>8}  {'docs':>6}")
        for task, metrics in self.tasks.items():
            for metric, value in metrics.items():
                if "_stderr" in metric:
                    continue
                stderr = metrics.get(metric.replace(",", "_stderr,", 1) if "," in metric else f"{metric}_stderr")
                stderr_text = f"{stderr:>8.4f}" if isinstance(stderr, float) and math.isfinite(stderr) else f"{'':>8}"
                lines.append(f"  {task:<{width}}  {metric:<16}  {value:>8.4f}  {stderr_text}  {self.samples.get(task, 0):>6,}")
        return "\n".join(lines)


def lm_eval_version() -> str | None:
    """The installed lm-eval release (task definitions and metrics change between releases), or None."""
    from importlib import metadata

    try:
        return metadata.version("lm_eval")
    except metadata.PackageNotFoundError:
        return None


def include_path_identity(include_path: str | None) -> dict[str, str] | None:
    """``{relative file: sha256}`` of the task files under ``include_path``: their content is the task."""
    if include_path is None:
        return None
    if "://" in include_path:
        raise HarnessConfigError(f"include_path {include_path!r} must be a local folder: lm-eval reads task files from local disk.")
    if not os.path.isdir(include_path):
        raise HarnessConfigError(f"include_path {include_path!r} is not a folder of lm-eval task files (YAML configs and their data).")
    files = {}
    for root, dirs, names in os.walk(include_path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".yaml", ".yml", ".json", ".jsonl", ".py", ".txt", ".csv")):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, include_path)] = "sha256:" + hashlib.sha256(f.read()).hexdigest()
    return files


def run_harness(
    loaded: LoadedModel,
    tokenizer: Any,
    *,
    tasks: list[str],
    model_label: str,
    model_identity: str,
    include_path: str | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    max_seq_len: int | None = None,
    batch_size: int = 8,
    max_gen_toks: int = 64,
    compute_dtype: str = "auto",
    seed: int = 0,
) -> HarnessResults:
    """Run ``tasks`` through lm-eval-harness on ``loaded`` and keep their aggregated metrics."""
    settings = HarnessSettings(tasks=tuple(tasks), include_path=include_path, limit=limit, num_fewshot=num_fewshot,
                               max_seq_len=max_seq_len, batch_size=batch_size, max_gen_toks=max_gen_toks,
                               compute_dtype=compute_dtype, seed=seed)
    return settings.evaluate(loaded.model, tokenizer, model_label=model_label, model_identity=model_identity,
                             model_path=loaded.path)


@dataclass(frozen=True)
class HarnessSettings:
    """How lm-eval-harness runs on a model: which tasks, on how many documents, with which numerics."""

    tasks: tuple[str, ...]
    include_path: str | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    max_seq_len: int | None = None
    batch_size: int = 8
    max_gen_toks: int = 64
    compute_dtype: str = "auto"
    seed: int = 0

    def evaluate(self, model: Any, tokenizer: Any, *, model_label: str, model_identity: str, model_path: str,
                 task_manager: Any = None) -> HarnessResults:
        """The tasks' aggregated metrics for ``model`` (one of ours, in memory) and its tokenizer."""
        import lm_eval

        from levanter.eval.harness import LevanterHarnessLM

        task_manager = task_manager or self.task_manager()
        lm = LevanterHarnessLM(model, tokenizer, max_seq_len=self.max_seq_len, batch_size=self.batch_size,
                               max_gen_toks=self.max_gen_toks, compute_dtype=self.compute_dtype, seed=self.seed)
        seed = self.seed
        started = time.perf_counter()
        output = lm_eval.simple_evaluate(
            model=lm, tasks=list(self.tasks), task_manager=task_manager, limit=self.limit, num_fewshot=self.num_fewshot,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            log_samples=False, bootstrap_iters=1000,
        )
        elapsed = time.perf_counter() - started
        metrics = {task: _clean_metrics(values) for task, values in output["results"].items()}
        samples = {task: int(counts.get("effective", counts.get("original", 0)))
                   for task, counts in output.get("n-samples", {}).items()}
        logger.info("lm-eval-harness: %d task(s) on %s in %.1f s", len(metrics), model_label, elapsed)
        return HarnessResults(
            model=model_label, model_identity=model_identity, model_path=model_path, tasks=metrics, samples=samples,
            num_fewshot=self.num_fewshot, limit=self.limit, max_seq_len=lm.max_seq_len,
            lm_eval_version=getattr(lm_eval, "__version__", "unknown"), eval_seconds=elapsed,
        )

    def task_manager(self) -> Any:
        """lm-eval's index of the tasks, refusing names it does not know."""
        from lm_eval.tasks import TaskManager

        manager = _task_manager(TaskManager, list(self.tasks), self.include_path)
        unknown = [task for task in self.tasks if task not in manager.all_tasks]
        if unknown:
            where = (f" or in {self.include_path}" if self.include_path
                     else "; pass include_path=... for tasks defined in your own YAML files")
            raise HarnessConfigError(f"unknown lm-eval task(s) {unknown}: not among lm-eval's tasks{where}.")
        return manager


def _task_manager(manager_cls: Any, tasks: list[str], include_path: str | None) -> Any:
    # Indexing lm-eval's thousands of built-in task files takes seconds; skip it when the include
    # path defines every task asked for.
    if include_path:
        local = manager_cls(include_path=include_path, include_defaults=False)
        if all(task in local.all_tasks for task in tasks):
            return local
        return manager_cls(include_path=include_path)
    return manager_cls()


def _clean_metrics(values: dict[str, Any]) -> dict[str, float]:
    cleaned = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or key.startswith("sample_len"):
            continue  # "alias" and other labels, and the document count (kept in ``samples``)
        cleaned[key.removesuffix(",none")] = float(value)
    return cleaned
