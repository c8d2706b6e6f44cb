"""lm-eval-harness tasks run on a model while it trains, as one of the trainer's model evaluations.

The trainer hands the evaluation the live model (built in memory from the weights it would export)
every few steps and after the last; nothing is checkpointed for it. Each run's metrics go to the
trainer's trackers as ``harness/<task>/<metric>`` (stderr and undefined values left out, so the
training page charts the metrics themselves), and the latest full results, stderr included, are
kept for the step's record and model card.
"""

from __future__ import annotations

import math
from typing import Any

from levanter.trainer.hooks import ModelEvaluation
from marin.evaluation.harness import HarnessResults, HarnessSettings

METRICS_PREFIX = "harness"


class HarnessDuringTraining:
    """``settings``' tasks on the model being trained; ``latest`` holds the newest results (None before any)."""

    def __init__(self, settings: HarnessSettings, tokenizer: Any, *, model_label: str, model_identity: str):
        self.settings = settings
        self.tokenizer = tokenizer
        self.model_label = model_label
        self.model_identity = model_identity
        self.latest: HarnessResults | None = None
        # Indexing lm-eval's tasks is done once, before training, so an unknown task fails then.
        self._task_manager = settings.task_manager()

    def evaluate(self, model: Any, step: int) -> dict[str, float]:
        self.latest = self.settings.evaluate(
            model, self.tokenizer, model_label=f"{self.model_label} at step {step}", model_identity=self.model_identity,
            model_path=f"(in memory, step {step})", task_manager=self._task_manager,
        )
        return metrics_line(self.latest)

    def model_evaluation(self, every: int | None) -> ModelEvaluation:
        return ModelEvaluation(METRICS_PREFIX, self.evaluate, every=every)


def metrics_line(results: HarnessResults) -> dict[str, float]:
    """``{"<task>/<metric>": value}``: the values a metrics line and a chart can hold."""
    return {f"{task}/{metric}": value for task, metrics in results.tasks.items() for metric, value in metrics.items()
            if "_stderr" not in metric and math.isfinite(value)}
