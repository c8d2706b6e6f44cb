"""Evaluation during training: the mean next-token loss of each eval set, run as a hook on its own schedule.

Every batch of a set is dispatched before any result is read, so the device is never idle waiting
for the host; the loss is summed over masked-in positions and divided once at the end, so a set's
loss does not depend on how it is cut into batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
from jax.sharding import NamedSharding

from levanter.data.batch import Batch
from levanter.trainer.data_feed import DataSourceError, to_device
from levanter.trainer.hooks import AtLastStep, Hook, StepInfo
from levanter.trainer.state import FrozenArrays, TrainState

# The trainer's own logger: evaluation results are lines of the training log.
logger = logging.getLogger("levanter.trainer")

EvalSources = Mapping[str, Callable[[], Iterable[Batch]]]


def evaluate_sets(
    eval_step: Callable[..., Any],
    params: Any,
    eval_sources: EvalSources,
    frozen: FrozenArrays | None,
    sharding_for_rows: Callable[[int], NamedSharding],
) -> dict[str, float]:
    """Mean next-token loss over the masked-in positions of each eval set."""
    results = {}
    for name, make_batches in eval_sources.items():
        started = time.monotonic()
        loss_total, weight_total = 0.0, 0.0
        sums = []
        for batch in make_batches():
            device_batch = to_device(batch, sharding_for_rows(batch.batch_size))
            sums.append(eval_step(params, device_batch, frozen))
        for loss_sum, weight_sum in jax.device_get(sums):
            loss_total += float(loss_sum)
            weight_total += float(weight_sum)
        if weight_total == 0:
            raise DataSourceError(f"Eval set {name!r} yielded no masked-in tokens.")
        results[name] = loss_total / weight_total
        logger.debug("eval %s: %d batches in %.1fs", name, len(sums), time.monotonic() - started)
    return results


def eval_hook(
    evaluate: Callable[[TrainState], dict[str, float]], trackers, history: list[dict[str, Any]], results: dict[str, float], every: int | None,
    *, evaluate_average: Callable[[TrainState], dict[str, float]] | None = None, average_results: dict[str, float] | None = None,
) -> Hook:
    """Every ``every`` steps and after the last; ``results`` keeps the latest losses. With
    ``evaluate_average`` (the weight average's losses) also ``eval_ema/<set>/loss``, kept in
    ``average_results``."""

    def run(info: StepInfo) -> None:
        results.clear()
        results.update(evaluate(info.state))
        eval_line = {f"eval/{name}/loss": loss for name, loss in results.items()}
        if evaluate_average is not None:
            average_results.clear()
            average_results.update(evaluate_average(info.state))
            eval_line.update({f"eval_ema/{name}/loss": loss for name, loss in average_results.items()})
        trackers.log(info.step, eval_line)
        history.append({"step": info.step, **eval_line})
        shown = {**results, **{f"{name} (ema)": loss for name, loss in (average_results or {}).items()}}
        logger.info("step %d eval: %s", info.step, ", ".join(f"{k} {v:.4f}" for k, v in shown.items()))

    return Hook("eval", run, every=every, at_last=AtLastStep.ALWAYS)
