"""Hooks: what the training loop does after a step, each on a schedule of its own.

A hook is a name, a schedule (``every`` N steps, an optional condition that is not a step count,
and what to do after the final step) and a function of the finished step. Of a list of hooks, the
loop runs those that are due in the order of the list, so that order is the order of their effects:
a step's metrics line is written before the checkpoint that a resume would cut the file back to,
and the checkpoint before the evaluation that may take a while.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class AtLastStep(enum.Enum):
    IF_DUE = "if_due"  # the final step is like any other: run if the schedule says so
    ALWAYS = "always"  # whatever the schedule: a run ends with a log line and an evaluation
    NEVER = "never"  # whatever the schedule: the trainer saves the final state itself, after the loop


@dataclass(frozen=True)
class StepInfo:
    """One finished step, as hooks see it."""

    step: int  # numbered from 1, as in metrics.jsonl: the number of updates applied so far
    metrics: Mapping[str, Any]  # the step's line in metrics.jsonl
    # The state after the step, for hooks that run before the next step is dispatched; None for
    # those that run one step late, when the next step may already be reusing its buffers.
    state: Any = None


@dataclass(frozen=True)
class Hook:
    name: str
    run: Callable[[StepInfo], None]
    every: int | None = 1  # due when ``step % every == 0``; None (or 0): never by step count
    # Due also when this says so, for schedules that are not a step count (minutes since the last save).
    when: Callable[[int], bool] | None = None
    at_last: AtLastStep = AtLastStep.IF_DUE

    def due(self, step: int, last_step: int) -> bool:
        if step == last_step and self.at_last is not AtLastStep.IF_DUE:
            return self.at_last is AtLastStep.ALWAYS
        if self.every and step % self.every == 0:
            return True
        return self.when is not None and self.when(step)


@dataclass(frozen=True)
class ModelEvaluation:
    """An evaluation the caller brings (a benchmark the trainer knows nothing about), run on the
    model being trained every ``every`` steps and after the last, from the weights in memory.

    ``evaluate(model, step)`` is given the whole model at the weights that are evaluated and
    exported (:meth:`Trainer.evaluation_params`) and returns ``{metric: value}``; the trainer logs
    them as ``<name>/<metric>`` at that step. Nothing is written to the checkpoints. ``at_start``:
    also evaluate the weights a fresh run starts from, logged at step 0 (the baseline the run is
    measured against).
    """

    name: str
    evaluate: Callable[[Any, int], Mapping[str, float]]
    every: int | None = None  # None: only after the last step
    at_start: bool = False


@dataclass(frozen=True)
class ModelPublisher:
    """Hands the live weights to a consumer outside the training step (the samplers of a
    reinforcement-learning run) as training starts and every ``every`` steps after, each time before
    the next step's batch is fetched, so a data source that waits for those weights cannot deadlock.

    ``publish(model, step)`` is given the whole model at the weights being trained (never a weight
    average) after ``step`` updates. The next step reuses the model's buffers: copy what you keep.
    """

    name: str
    publish: Callable[[Any, int], None]
    every: int = 1


def due_hooks(hooks: Iterable[Hook], step: int, last_step: int) -> list[Hook]:
    """The hooks to run after ``step``, in the order given."""
    return [hook for hook in hooks if hook.due(step, last_step)]


def run_hooks(hooks: Iterable[Hook], info: StepInfo) -> None:
    for hook in hooks:
        hook.run(info)
