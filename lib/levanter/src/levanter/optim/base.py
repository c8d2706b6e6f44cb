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
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from levanter.models.transformer import fields_to_record
from levanter.optim.errors import OptimizerConfigError, ScheduleError
from levanter.optim.schedule import SCHEDULE_NAMES, build_lr_schedule

# A pytree of bools shaped like the parameters (True = apply weight decay), or a function of the
# parameters returning one, as optax's ``mask=`` arguments accept.
DecayMask = Any

# A pytree shaped like the parameters whose leaves are ``haliax.module.Axes`` (the logical axis names
# of each parameter, stacking axes such as ``layers`` first), as ``haliax.module.logical_axes``
# returns. Optimizers that treat matrices as matrices (Muon, SOAP, ...) read which dimensions stack
# copies and which are the matrix's own from it; ``None`` when ``build`` is called without a model.
ParamAxes = Any


def default_weight_decay_mask(params) -> Any:
    """Decay matrices (and stacked matrices), not vectors.

    1-D parameters are norm scales and biases: decaying them pulls norms towards zero and biases
    towards an arbitrary origin, which only hurts. Embeddings are 2-D and *are* decayed: with tied
    embeddings the same matrix is the output projection, and treating every matrix alike keeps the
    rule a plain, checkable statement about ranks. Stacked (scanned) layers add a leading axis;
    callers that know the logical axes should pass a mask built with
    :func:`weight_decay_mask_from_axes` instead.
    """
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


# Logical axes that stack copies of a parameter rather than being part of its shape.
STACKING_AXES = frozenset({"layers", "experts"})


def weight_decay_mask_from_axes(axes_tree, params) -> Any:
    """Decay a parameter iff it has at least two axes besides the stacking ones (layers, experts).

    ``axes_tree`` holds, per parameter, a tuple of logical axis names (as
    ``haliax.partitioning.logical_axes`` returns); a stacked norm ``("layers", "embed")`` is then
    recognised as a vector and not decayed.
    """

    def decide(p, names):
        if p is None:
            return None
        if names is None:
            return p.ndim >= 2
        core = [n for n in names if n not in STACKING_AXES]
        return len(core) >= 2

    return jax.tree.map(decide, params, axes_tree, is_leaf=lambda x: x is None)


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

    def _decay(self, weight_decay_mask: DecayMask | None) -> optax.GradientTransformation:
        if not self.weight_decay:
            return optax.identity()
        mask = default_weight_decay_mask if weight_decay_mask is None else weight_decay_mask
        return optax.add_decayed_weights(self.weight_decay, mask=mask)
