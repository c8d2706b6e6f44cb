"""The optimizer-config base class and the registry that makes configs round-trip through JSON.

Adding an optimizer: subclass :class:`OptimizerConfig` as a frozen, keyword-only dataclass,
decorate it with ``@OptimizerConfig.register("name")`` and implement ``build``. The shared fields
(learning rate, schedule, clipping, weight decay) and the weight-decay mask come for free.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from levanter.optim.errors import OptimizerConfigError, ScheduleError
from levanter.optim.param_axes import DEFAULT_WEIGHT_DECAY_EXCLUDE, STACKING_AXES, DecayMask, ParamAxes
from levanter.optim.weight_decay import check_patterns, weight_decay_mask
from levanter.optim.schedule import SCHEDULE_NAMES, build_lr_schedule
from levanter.recorded_fields import OMIT_WHEN_DEFAULT, fields_to_record

def default_weight_decay_mask(params) -> Any:
    """The default mask without axis names: 2-D arrays are decayed, anything else is not."""
    return weight_decay_mask(params)


def weight_decay_mask_from_axes(axes_tree, params) -> Any:
    """The default mask from each parameter's logical axes (``haliax.module.logical_axes``):
    hidden matrices are decayed; vectors (also stacked ones, ``("layers", "embed")``), the
    embedding and the output head are not."""
    return weight_decay_mask(params, axes_tree)


def require(
    config: object,
    field: str,
    holds: Callable[[float], bool],
    expected: str,
    *,
    optional: bool = False,
    error: type[OptimizerConfigError] = OptimizerConfigError,
) -> None:
    """Refuse ``config.<field>`` unless it is a finite real number (not a bool) for which ``holds`` is true.

    Checked when a config is made, so a NaN learning rate or a beta of 1 fails where it is written
    rather than as a NaN loss hours into a run.
    """
    value = getattr(config, field)
    if value is None and optional:
        return
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and holds(value)):
        raise error(f"{type(config).__name__}.{field} must be {expected}; got {value!r}.")


def scale_by_learning_rate(schedule: optax.Schedule) -> optax.GradientTransformationExtraArgs:
    """``optax.scale_by_learning_rate(schedule)`` (same state, same result), whose ``update`` also
    accepts ``learning_rate=``, the rate of this step, in place of ``schedule(count)``.

    The trainer computes the rate outside its compiled step and passes it in: the step's program
    then holds none of the schedule's numbers (run length, warm-up, peak rate), so a rerun with
    another ``num_train_steps`` or learning rate loads it from JAX's compilation cache.
    """
    scheduled = optax.scale_by_learning_rate(schedule)

    def update(updates, state, params=None, *, learning_rate=None, **extra_args):
        if learning_rate is None:
            return scheduled.update(updates, state, params)
        updates = jax.tree.map(lambda g: jnp.asarray(-learning_rate, dtype=g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(scheduled.init, update)


def _steps_or_fraction(value: float) -> bool:
    return value >= 0 and (value < 1 or float(value).is_integer())


@dataclass(frozen=True)
class OptimizerConfig:
    """Fields every optimizer shares. ``learning_rate`` and ``weight_decay`` may be positional."""

    learning_rate: float
    weight_decay: float = 0.0
    _: KW_ONLY
    max_grad_norm: float | None = 1.0
    warmup: float = 0.0
    decay: float | None = None
    min_lr_ratio: float = 0.0
    lr_schedule: str = "cosine"
    # Cycles of the schedule (levanter.optim.schedule): `cycles` equal ones, or new ones starting at
    # the steps (or shares of the run) in `restarts`; later cycles warm up over `rewarmup` (None: as
    # `warmup`). Options added after configs were hashed into step identities are omitted from the
    # record while at their defaults (see to_dict), so those identities stay.
    cycles: int = field(default=1, metadata=OMIT_WHEN_DEFAULT)
    restarts: tuple[float, ...] = field(default=(), metadata=OMIT_WHEN_DEFAULT)
    rewarmup: float | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)
    # What decoupled weight decay leaves alone, and exceptions to that: roles ("vector", "embedding",
    # "head", "matrix") or globs over dotted parameter paths ("*.lm_head.weight"); see
    # levanter.optim.weight_decay.
    weight_decay_exclude: tuple[str, ...] = field(default=DEFAULT_WEIGHT_DECAY_EXCLUDE, metadata=OMIT_WHEN_DEFAULT)
    weight_decay_include: tuple[str, ...] = field(default=(), metadata=OMIT_WHEN_DEFAULT)

    _registry: ClassVar[dict[str, type["OptimizerConfig"]]] = {}
    type_name: ClassVar[str] = ""
    # True when the transformation's ``update`` needs ``obj_fn=`` (the parameters -> this batch's
    # loss), as Sophia's Hessian estimate does; the trainer's step then passes it.
    needs_objective: ClassVar[bool] = False

    def __post_init__(self) -> None:
        require(self, "learning_rate", lambda v: v > 0, "a finite number > 0, e.g. 3e-4")
        require(self, "weight_decay", lambda v: v >= 0, "a finite number >= 0 (0 turns weight decay off)")
        require(self, "max_grad_norm", lambda v: v >= 0, "a finite number > 0, or None or 0 for no clipping", optional=True)
        steps = "a fraction of the run below 1 or a whole number of steps (finite, >= 0)"
        require(self, "warmup", _steps_or_fraction, steps, error=ScheduleError)
        until_the_end = f"None (the rest of the run) or {steps}"
        require(self, "decay", _steps_or_fraction, until_the_end, optional=True, error=ScheduleError)
        require(self, "min_lr_ratio", lambda v: 0 <= v <= 1, "a number in [0, 1]", error=ScheduleError)
        if self.lr_schedule not in SCHEDULE_NAMES:
            raise ScheduleError(
                f"{type(self).__name__}.lr_schedule must be one of {', '.join(SCHEDULE_NAMES)}; got {self.lr_schedule!r}."
            )
        self._check_cycles(steps)
        for name in ("weight_decay_exclude", "weight_decay_include"):
            object.__setattr__(self, name, check_patterns(type(self).__name__, name, getattr(self, name)))

    def _check_cycles(self, steps: str) -> None:
        owner = type(self).__name__
        if isinstance(self.cycles, bool) or not isinstance(self.cycles, int) or self.cycles < 1:
            raise ScheduleError(f"{owner}.cycles must be a whole number >= 1 (1: no restarts); got {self.cycles!r}.")
        if isinstance(self.restarts, str | numbers.Real):
            raise ScheduleError(f"{owner}.restarts must be a list of steps; got {self.restarts!r}.")
        object.__setattr__(self, "restarts", tuple(self.restarts))  # JSON and YAML give lists
        for i, value in enumerate(self.restarts):
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value > 0 and _steps_or_fraction(value)):
                raise ScheduleError(f"{owner}.restarts[{i}] must be {steps} and > 0; got {value!r}.")
        if list(self.restarts) != sorted(set(self.restarts)):
            raise ScheduleError(f"{owner}.restarts must be increasing; got {self.restarts!r}.")
        if self.cycles > 1 and self.restarts:
            raise ScheduleError(f"{owner}: give cycles (equal cycles) or restarts (where cycles start), not both.")
        require(self, "rewarmup", _steps_or_fraction, f"None (as warmup) or {steps}", optional=True, error=ScheduleError)

    @classmethod
    def register(cls, name: str) -> Callable[[type["OptimizerConfig"]], type["OptimizerConfig"]]:
        def decorate(subclass: type[OptimizerConfig]) -> type[OptimizerConfig]:
            if name in cls._registry and cls._registry[name] is not subclass:
                raise OptimizerConfigError(f"An optimizer named {name!r} is already registered.")
            subclass.type_name = name
            cls._registry[name] = subclass
            return subclass

        return decorate

    @classmethod
    def registered(cls) -> dict[str, type["OptimizerConfig"]]:
        return dict(cls._registry)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable record, ``{"type": name, **fields}``, readable by :meth:`from_dict`."""
        # Options added after configs of a class were hashed into step identities carry
        # OMIT_WHEN_DEFAULT: left at their default they are not recorded, so old hashes stay.
        values = dataclasses.asdict(self)
        return {"type": self.type_name, **{f.name: values[f.name] for f in fields_to_record(self)}}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "OptimizerConfig":
        record = dict(record)
        name = record.pop("type", None)
        if name not in cls._registry:
            raise OptimizerConfigError(
                f"Unknown optimizer type {name!r}; registered: {', '.join(sorted(cls._registry))}."
            )
        return cls._registry[name](**record)

    def lr_scheduler(self, num_train_steps: int) -> optax.Schedule:
        return build_lr_schedule(
            learning_rate=self.learning_rate,
            num_train_steps=num_train_steps,
            lr_schedule=self.lr_schedule,
            warmup=self.warmup,
            decay=self.decay,
            min_lr_ratio=self.min_lr_ratio,
            cycles=self.cycles,
            restarts=self.restarts,
            rewarmup=self.rewarmup,
        )

    def build(
        self,
        num_train_steps: int,
        *,
        weight_decay_mask: DecayMask | None = None,
        param_axes: ParamAxes | None = None,
    ) -> optax.GradientTransformation:
        """The optax transformation for a run of ``num_train_steps`` steps.

        ``param_axes``: each parameter's logical axes (see :data:`ParamAxes`); element-wise
        optimizers ignore it. Its ``update`` also takes ``learning_rate=`` (an extra argument, as ``optax.chain`` passes
        them on): the rate of this step, given from outside instead of read from the schedule.
        """
        raise NotImplementedError

    def evaluation_params(self, params: Any, opt_state: Any) -> Any:
        """The parameters to evaluate and export after the steps that led to ``params`` and
        ``opt_state``: the training iterate itself, except for optimizers (schedule-free) that
        train at one point and evaluate at another."""
        return params

    def _learning_rate(self, num_train_steps: int) -> optax.GradientTransformationExtraArgs:
        """The last link of every chain: scale by ``-learning_rate``, see :func:`scale_by_learning_rate`."""
        return scale_by_learning_rate(self.lr_scheduler(num_train_steps))

    def _clipping(self) -> optax.GradientTransformation:
        if self.max_grad_norm is None or self.max_grad_norm <= 0:
            return optax.identity()
        return optax.clip_by_global_norm(self.max_grad_norm)

    def weight_decay_mask(self, params: Any, param_axes: ParamAxes | None = None) -> Any:
        """True for each parameter this config's weight decay applies to (``weight_decay_exclude``,
        ``weight_decay_include``; see :mod:`levanter.optim.weight_decay`)."""
        return weight_decay_mask(params, param_axes, self.weight_decay_exclude, self.weight_decay_include)

    def _decay(self, weight_decay_mask: DecayMask | None, param_axes: ParamAxes | None = None) -> optax.GradientTransformation:
        """Decoupled weight decay on the parameters of ``weight_decay_mask`` when given, else on
        those :meth:`weight_decay_mask` chooses from ``param_axes``."""
        if not self.weight_decay:
            return optax.identity()
        mask = weight_decay_mask
        if mask is None:
            mask = lambda params: self.weight_decay_mask(params, param_axes)  # noqa: E731
        return optax.add_decayed_weights(self.weight_decay, mask=mask)
