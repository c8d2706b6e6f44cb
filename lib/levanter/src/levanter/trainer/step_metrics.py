"""Each training step's metrics: read from the device, checked, and handed to the logging hooks.

:func:`record_step` waits for a step's scalars, refuses a non-finite loss (before that state can
be checkpointed; unless the step skipped it, see ``TrainerConfig.skip_bad_steps``) and builds the step's line: loss, learning rate, gradient norm and the rates of
:mod:`levanter.trainer.throughput`, then an objective's own scalars. :func:`logging_hooks` are what
receives each line: ``metrics.jsonl`` always, the other trackers and the console every
``log_every`` steps (or a terminal's progress bar instead of the console), the run's history, and
the hooks a caller gave the trainer.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import jax

from levanter.errors import LevanterError
from levanter.trainer.config import TrainerConfig
from levanter.trainer.hooks import AtLastStep, Hook, StepInfo, due_hooks, run_hooks
from levanter.trainer.throughput import ThroughputMeter, WindowThroughput

# The trainer's own logger: these are the lines of the training log.
logger = logging.getLogger("levanter.trainer")


class NonFiniteLossError(LevanterError, FloatingPointError):
    """The training loss became NaN or infinite."""


def record_step(
    step: int, device_metrics: dict[str, jax.Array], *, meter: ThroughputMeter, log_hooks: list[Hook], last_step: int
) -> dict[str, Any]:
    """Read a step's scalars (waiting for the step), refuse a non-finite loss, run the logging hooks."""
    values = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
    now = time.monotonic()
    skipped = values.get("train/skipped_steps", 0) > 0  # a skipped step left the state as it was
    if not skipped and (not math.isfinite(values["loss"]) or not math.isfinite(values["total_loss"])):
        raise NonFiniteLossError(
            f"Training loss is {values['loss']} (total objective {values['total_loss']}) at step {step}. "
            "Lower the learning rate, raise warmup, add z_loss_weight or check the data; "
            "the last good checkpoint is kept."
        )
    rate = meter.step(now)
    line = {
        "loss": values["loss"],
        "lr": values["lr"],
        "grad_norm": values["grad_norm"],
        "tokens": rate.tokens,
        "tokens_per_second": rate.tokens_per_second,
        "mfu": rate.mfu,
        "wall_time": rate.wall_time,
        "aux_loss": values["aux_loss"],
        "z_loss": values["z_loss"],
        "loss_tokens": values["loss_tokens"],
    }
    # An objective's own scalars (a preference objective's rewards and accuracy) follow.
    line.update({k: v for k, v in values.items() if k not in line and k != "total_loss"})
    for count in ("train/skipped_steps", "train/skipped_steps_total"):
        if count in line:
            line[count] = int(line[count])
    run_hooks(due_hooks(log_hooks, step, last_step), StepInfo(step, line))
    return line


def logging_hooks(
    config: TrainerConfig,
    trackers,
    history: list[dict[str, Any]],
    meter: ThroughputMeter,
    bar: Any,
    callers_hooks: Callable[[StepInfo], None],
) -> list[Hook]:
    """Run as each step's scalars are read, usually one step late. ``bar``: a terminal's progress
    bar, which then takes the console lines' place; ``callers_hooks`` runs the hooks given to the
    trainer."""
    log_every, last = config.log_every, AtLastStep.ALWAYS
    jsonl, *others = trackers.trackers

    def write_others(info: StepInfo) -> None:
        for tracker in others:
            tracker.log(info.step, info.metrics)

    return [
        Hook("metrics.jsonl", lambda info: jsonl.log(info.step, info.metrics)),
        *([Hook("trackers", write_others, every=log_every, at_last=last)] if others else []),
        Hook("history", lambda info: history.append({"step": info.step, **info.metrics})),
        (Hook("console", lambda info: _log_progress(info, meter.window(), config.num_train_steps), every=log_every, at_last=last)
         if bar is None else Hook("progress bar", lambda info: _advance(bar, info))),
        Hook("hooks", callers_hooks),
    ]


def _log_progress(info: StepInfo, window: WindowThroughput, last_step: int) -> None:
    m = info.metrics
    logger.info(
        "step %d/%d  loss %.4f  lr %.3g  grad_norm %.3g  %.0f tokens/s%s  elapsed %s  ETA %s",
        info.step, last_step, m["loss"], m["lr"], m["grad_norm"], window.tokens_per_second,
        "" if m["mfu"] is None else f"  MFU {100 * m['mfu']:.1f}%",
        _format_duration(m["wall_time"]), _format_duration(window.seconds_per_step * (last_step - info.step)),
    )


def _advance(bar: Any, info: StepInfo) -> None:
    m = info.metrics
    bar.set_postfix(loss=f"{m['loss']:.4f}", lr=f"{m['lr']:.3g}", refresh=False)
    bar.update(1)  # the hook runs once for every step whose scalars are read


def _format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
