"""Learning-rate schedules: a warm-up followed by a constant, linear, cosine or WSD shape, once or
in cycles.

A schedule is a plain function ``step -> learning rate`` (an ``optax.Schedule``) so the trainer can
log the rate it used at each step and the optimizer can consume it unchanged. A run in cycles
(cosine with restarts, repeated WSD) restarts the whole schedule at each cycle's first step, as if
the cycle were a run of its own: warm-up (``rewarmup`` after the first cycle), then the shape, with
``warmup`` and ``decay`` fractions read as shares of the cycle.
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
    cycles: int = 1,
    restarts: tuple[float, ...] = (),
    rewarmup: float | None = None,
) -> optax.Schedule:
    """The learning rate at each optimizer step (0-based).

    - warm-up: ``warmup`` steps (or that share of the run) rising linearly to ``learning_rate``; the
      first step already uses ``learning_rate / warmup_steps`` so no step is wasted at rate 0.
    - ``constant``: the peak rate after warm-up.
    - ``linear`` / ``cosine``: from the peak down to ``min_lr_ratio * learning_rate`` over ``decay``
      steps (default: every step after warm-up), then flat.
    - ``wsd``: the peak until the last ``decay`` steps (default 20% of the run), then a linear decay
      to the minimum.

    Cycles: ``cycles`` equal cycles (the last takes the remainder), or new cycles starting at each
    step of ``restarts`` (steps, or shares of the run below 1). Each cycle is the schedule above
    with the cycle's length as the run's; cycles after the first warm up over ``rewarmup`` steps
    (default: as ``warmup``; 0 restarts at the peak).
    """
    starts = _cycle_starts(num_train_steps, cycles, tuple(restarts))
    if len(starts) == 1:
        return _one_cycle(learning_rate, num_train_steps, lr_schedule, warmup, decay, min_lr_ratio)
    ends = starts[1:] + [num_train_steps]
    again = warmup if rewarmup is None else rewarmup
    parts = [
        _one_cycle(learning_rate, end - start, lr_schedule, warmup if i == 0 else again, decay, min_lr_ratio,
                   where=f" in cycle {i + 1} (steps {start}-{end - 1})",
                   warmup_name="warmup" if i == 0 or rewarmup is None else "rewarmup")
        for i, (start, end) in enumerate(zip(starts, ends))
    ]
    first_steps = jnp.asarray(starts, jnp.float32)

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        index = jnp.searchsorted(first_steps, step, side="right") - 1
        rates = jnp.stack([part(step - start) for part, start in zip(parts, starts)])
        return jnp.take_along_axis(rates, index[None, ...].astype(jnp.int32), axis=0)[0]

    return schedule


def _cycle_starts(num_train_steps: int, cycles: int, restarts: tuple[float, ...]) -> list[int]:
    """The first step of each cycle, 0 first."""
    if num_train_steps <= 0:
        raise ScheduleError(f"num_train_steps must be positive, got {num_train_steps}.")
    if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 1:
        raise ScheduleError(f"cycles must be a whole number >= 1, got {cycles!r}.")
    if cycles > 1 and restarts:
        raise ScheduleError("Give cycles (equal cycles) or restarts (the steps where cycles start), not both.")
    if cycles > num_train_steps:
        raise ScheduleError(f"cycles={cycles} is more than the run's {num_train_steps} steps.")
    if cycles > 1:
        length = num_train_steps // cycles
        return [i * length for i in range(cycles)]
    starts = [steps_from_fraction_or_count(r, num_train_steps, "restarts") for r in restarts]
    if any(s <= 0 or s >= num_train_steps for s in starts) or starts != sorted(set(starts)):
        raise ScheduleError(
            f"restarts must be increasing steps inside the run (1 to {num_train_steps - 1}); {tuple(restarts)} gives {starts}."
        )
    return [0, *starts]


def _one_cycle(
    learning_rate: float,
    num_train_steps: int,
    lr_schedule: str,
    warmup: float,
    decay: float | None,
    min_lr_ratio: float,
    where: str = "",
    warmup_name: str = "warmup",
) -> optax.Schedule:
    if lr_schedule not in SCHEDULE_NAMES:
        raise ScheduleError(f"Unknown lr_schedule {lr_schedule!r}; choose one of {', '.join(SCHEDULE_NAMES)}.")
    if num_train_steps <= 0:
        raise ScheduleError(f"num_train_steps must be positive, got {num_train_steps}.")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ScheduleError(f"min_lr_ratio must lie in [0, 1], got {min_lr_ratio}.")

    warmup_steps = steps_from_fraction_or_count(warmup, num_train_steps, warmup_name) or 0
    if warmup_steps > num_train_steps:
        what = "the cycle" if where else "the run"
        raise ScheduleError(f"{warmup_name} ({warmup_steps} steps){where} is longer than {what} ({num_train_steps} steps).")
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
