"""Learning-rate schedules: a warm-up followed by a constant, linear, cosine or WSD shape.

A schedule is a plain function ``step -> learning rate`` (an ``optax.Schedule``) so the trainer can
log the rate it used at each step and the optimizer can consume it unchanged.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import optax

from levanter.optim.errors import ScheduleError

SCHEDULE_NAMES = ("constant", "linear", "cosine", "wsd")

# WSD ("warmup, stable, decay") keeps the peak rate for most of the run and decays only at the end;
# when the config does not say how long the decay is, this share of the run is used.
DEFAULT_WSD_DECAY_FRACTION = 0.2


def steps_from_fraction_or_count(value: float | int | None, num_train_steps: int, what: str) -> int | None:
    """Read ``value`` as a share of the run when it is below 1, else as a number of steps."""
    if value is None:
        return None
    if value < 0:
        raise ScheduleError(f"{what} must be >= 0 (a fraction of the run below 1, or a step count), got {value}.")
    if value < 1:
        return int(round(value * num_train_steps))
    if float(value) != int(value):
        raise ScheduleError(f"{what}={value} is >= 1 so it is read as a step count; give an integer.")
    return int(value)


def build_lr_schedule(
    *,
    learning_rate: float,
    num_train_steps: int,
    lr_schedule: str = "cosine",
    warmup: float = 0.0,
    decay: float | None = None,
    min_lr_ratio: float = 0.0,
) -> optax.Schedule:
    """The learning rate at each optimizer step (0-based).

    - warm-up: ``warmup`` steps (or that share of the run) rising linearly to ``learning_rate``; the
      first step already uses ``learning_rate / warmup_steps`` so no step is wasted at rate 0.
    - ``constant``: the peak rate after warm-up.
    - ``linear`` / ``cosine``: from the peak down to ``min_lr_ratio * learning_rate`` over ``decay``
      steps (default: every step after warm-up), then flat.
    - ``wsd``: the peak until the last ``decay`` steps (default 20% of the run), then a linear decay
      to the minimum.
    """
    if lr_schedule not in SCHEDULE_NAMES:
        raise ScheduleError(f"Unknown lr_schedule {lr_schedule!r}; choose one of {', '.join(SCHEDULE_NAMES)}.")
    if num_train_steps <= 0:
        raise ScheduleError(f"num_train_steps must be positive, got {num_train_steps}.")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ScheduleError(f"min_lr_ratio must lie in [0, 1], got {min_lr_ratio}.")

    warmup_steps = steps_from_fraction_or_count(warmup, num_train_steps, "warmup") or 0
    if warmup_steps > num_train_steps:
        raise ScheduleError(f"warmup ({warmup_steps} steps) is longer than the run ({num_train_steps} steps).")
    min_lr = learning_rate * min_lr_ratio
    after_warmup = max(num_train_steps - warmup_steps, 1)

    if lr_schedule == "wsd":
        default_decay = int(math.ceil(DEFAULT_WSD_DECAY_FRACTION * num_train_steps))
        decay_steps = steps_from_fraction_or_count(decay, num_train_steps, "decay")
        decay_steps = default_decay if decay_steps is None else decay_steps
        decay_steps = max(min(decay_steps, after_warmup), 1)
        decay_start = num_train_steps - decay_steps
    else:
        decay_steps = steps_from_fraction_or_count(decay, num_train_steps, "decay")
        decay_steps = max(after_warmup if decay_steps is None else decay_steps, 1)
        decay_start = warmup_steps

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = learning_rate * jnp.minimum((step + 1.0) / max(warmup_steps, 1), 1.0)
        progress = jnp.clip((step - decay_start) / decay_steps, 0.0, 1.0)
        if lr_schedule == "constant":
            shaped = jnp.asarray(learning_rate, jnp.float32)
        elif lr_schedule == "cosine":
            shaped = min_lr + (learning_rate - min_lr) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        else:  # linear and the decay phase of wsd
            shaped = learning_rate + (min_lr - learning_rate) * progress
        return jnp.where(step < warmup_steps, warm, shaped)

    return schedule
