"""Sweeps as steps: a grid of settings, or an IsoFLOP design, expanded into named ``train_lm`` steps.

A sweep is nothing but steps: each point is an ordinary ``train_lm`` handle with its own name and
identity, so a point finished in one run (or by another worker) is cached for every later one,
and a grid that grows reruns only its new points. What a point *is* (its setting, its FLOP budget,
the compute it plans to spend) travels as the step's ``annotations``, outside its identity: a
dry run adds the planned FLOPs up, and the scaling fits (:mod:`marin.scaling`) read a point's
budget from the step folder's ``.executor_info``.

- :func:`grid` is the Cartesian product of a few axes, as a list of settings;
- :func:`train_sweep` turns settings into ``train_lm`` steps named ``<sweep>/<label>``;
- :func:`isoflop_grid` chooses, for each FLOP budget, how many steps each candidate model trains
  to spend it (by the model's own FLOP count per token), and :func:`isoflop_sweep` makes the steps,
  named ``<sweep>/<budget>/<model>``.

Many workers share one sweep by running the same script with ``marin run`` on one prefix: each
step is run once, by whichever worker takes its lease first (docs/scaling.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marin.errors import MarinError
from marin.execution.lazy import LazyStep
from marin.experiment.train import flops_per_token_of, train_lm

# A point planned to train fewer steps than this is dropped: a loss after a handful of steps says
# more about the warm-up than about the model size.
DEFAULT_MIN_STEPS = 10

_LABEL_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")


class SweepError(MarinError, ValueError):
    """A sweep that cannot be declared as asked (an empty axis, a budget too small for its models, ...)."""


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, as settings; the last axis varies fastest.

    ``grid(learning_rate=[1e-3, 3e-3], model=["h32", "h64"])`` is four settings.
    """
    for axis, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise SweepError(f"grid axis {axis!r} must be a non-empty list of values, got {values!r}.")
    names = list(axes)
    return [dict(zip(names, combination)) for combination in itertools.product(*(axes[n] for n in names))]


def setting_label(setting: Mapping[str, Any]) -> str:
    """A folder-safe name for a setting: ``learning_rate-0.003_model-h64`` (floats as ``%g``).

    Values that have no short safe spelling (a model config object) need names: pass models by name
    to :func:`train_sweep`, or give the setting a ``label``.
    """
    if "label" in setting:
        label = str(setting["label"])
    else:
        label = "_".join(f"{key}-{_value_label(key, value)}" for key, value in setting.items())
    if not _LABEL_SAFE.match(label):
        raise SweepError(f"The sweep label {label!r} has characters unsafe in folder names; give the setting a 'label' "
                         "made of letters, digits, '.', '_' and '-'.")
    return label


def _value_label(key: str, value: Any) -> str:
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}".replace("+", "")
    if isinstance(value, str) and _LABEL_SAFE.match(value):
        return value
    raise SweepError(f"The sweep setting {key}={value!r} has no short name for its step; give the setting a 'label', "
                     "or pass models by name (models={'h64': config, ...}) and use the name in the grid.")


def train_sweep(
    name: str,
    settings: Sequence[Mapping[str, Any]],
    *,
    models: Mapping[str, Any] | None = None,
    vocab_size: int | None = None,
    **shared: Any,
) -> list[LazyStep]:
    """One ``train_lm`` step per setting, named ``<name>/<label>``; ``shared`` holds the arguments all take.

    A setting's keys are ``train_lm`` arguments (a setting's value wins over ``shared``), plus an
    optional ``label``; an ``optimizer`` setting may also be a dict of fields to change on the
    shared optimizer config (``{"learning_rate": 3e-3}``), and a ``model`` setting may name one of
    ``models``. With ``vocab_size`` each step also declares the FLOPs it plans to spend, which a
    dry run adds up.
    """
    if not settings:
        raise SweepError(f"Sweep {name!r} has no settings; grid(...) or a list of dicts gives them.")
    steps: list[LazyStep] = []
    seen: dict[str, Mapping[str, Any]] = {}
    for setting in settings:
        label = setting_label(setting)
        if label in seen:
            raise SweepError(f"Sweep {name!r} has two settings labelled {label!r}: {dict(seen[label])} and {dict(setting)}.")
        seen[label] = setting
        arguments = {**shared, **{key: value for key, value in setting.items() if key != "label"}}
        arguments["model"] = _model(arguments.get("model"), models)
        arguments["optimizer"] = _optimizer(arguments.get("optimizer"), shared.get("optimizer"))
        step = train_lm(f"{name}/{label}", **arguments)
        annotations = {**step.annotations, "sweep": {"name": name, "label": label, "setting": _plain(setting)}}
        flops = _planned_flops(arguments, vocab_size)
        if flops is not None:
            annotations["flops"] = flops
        steps.append(dataclasses.replace(step, annotations=annotations))
    return steps


def _model(model: Any, models: Mapping[str, Any] | None) -> Any:
    if isinstance(model, str) and models is not None:
        if model not in models:
            raise SweepError(f"The sweep names the model {model!r}, which models= does not have: {', '.join(models)}.")
        return models[model]
    return model


def _optimizer(value: Any, shared: Any) -> Any:
    if isinstance(value, Mapping):
        if shared is None:
            raise SweepError("An optimizer setting given as changes ({...}) needs a shared optimizer= to change.")
        return dataclasses.replace(shared, **value)
    return value


def _plain(setting: Mapping[str, Any]) -> dict[str, Any]:
    """The setting as JSON data for the step's annotations (objects by their type name)."""
    plain: dict[str, Any] = {}
    for key, value in setting.items():
        if value is None or isinstance(value, (bool, int, float, str)):
            plain[key] = value
        elif isinstance(value, Mapping):
            plain[key] = _plain(value)
        else:
            plain[key] = type(value).__name__
    return plain


def _planned_flops(arguments: Mapping[str, Any], vocab_size: int | None) -> float | None:
    per_token = None if vocab_size is None else flops_per_token_of(arguments.get("model"), vocab_size, arguments["seq_len"])
    if per_token is None:
        return None
    return per_token * arguments["batch_size"] * arguments["seq_len"] * arguments["num_train_steps"]


@dataclass(frozen=True)
class IsoFlopPoint:
    """One model trained for one FLOP budget: how many steps spend it, and what that makes."""

    budget: float
    model_label: str
    model: Any
    num_train_steps: int
    tokens: int
    params: int  # every parameter, embeddings included (the Chinchilla convention)
    flops_per_token: float
    flops: float  # what the steps really spend: the budget, up to rounding to whole steps

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params


def budget_label(budget: float) -> str:
    """``1e13``, ``3e12``, ``2.5e12``: a budget as a folder name."""
    mantissa, exponent = f"{budget:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def isoflop_grid(
    budgets: Sequence[float],
    models: Mapping[str, Any],
    *,
    vocab_size: int,
    batch_size: int,
    seq_len: int,
    min_steps: int = DEFAULT_MIN_STEPS,
    max_tokens: int | None = None,
) -> list[IsoFlopPoint]:
    """For each budget, each model trained for the number of steps that spends it.

    The FLOPs of a step are ``model.flops_per_token(vocab_size, seq_len) * batch_size * seq_len``;
    the steps are rounded to the nearest whole number, so a point's ``flops`` differ from its budget
    by at most half a step. Points under ``min_steps`` are left out (the model is too large for
    that budget), and so are points over ``max_tokens`` (the model is too small: it would repeat
    data of that many tokens); a budget left with fewer than three models is refused, since its
    IsoFLOP parabola needs three sizes.
    """
    if not budgets or not models:
        raise SweepError("An IsoFLOP grid needs at least one budget and three models.")
    points: list[IsoFlopPoint] = []
    tokens_per_step = batch_size * seq_len
    for budget in sorted(float(b) for b in budgets):
        if not math.isfinite(budget) or budget <= 0:
            raise SweepError(f"A FLOP budget must be a positive number, got {budget!r}.")
        kept, dropped = [], []
        for label, model in models.items():
            flops_per_token = flops_per_token_of(model, vocab_size, seq_len)
            if flops_per_token is None or not callable(getattr(model, "num_parameters", None)):
                raise SweepError(f"Model {label!r} ({type(model).__name__}) does not count its FLOPs per token and "
                                 "parameters; an IsoFLOP grid needs both (LlamaConfig, MoE and GPT-2 configs have them).")
            steps = round(budget / (flops_per_token * tokens_per_step))
            tokens = steps * tokens_per_step
            if steps < min_steps:
                dropped.append(f"{label} ({steps} steps)")
                continue
            if max_tokens is not None and tokens > max_tokens:
                dropped.append(f"{label} ({tokens:,} tokens)")
                continue
            kept.append(IsoFlopPoint(budget, label, model, steps, tokens, int(model.num_parameters(vocab_size)),
                                     flops_per_token, flops_per_token * tokens))
        if len(kept) < 3:
            raise SweepError(
                f"The budget {budget:.3g} FLOPs leaves {len(kept)} model(s) with at least {min_steps} steps"
                f"{'' if max_tokens is None else f' and at most {max_tokens:,} tokens'} "
                f"({', '.join(p.model_label for p in kept) or 'none'}; left out: {', '.join(dropped) or 'none'}). "
                "Its IsoFLOP parabola needs three sizes: change the budget, add models of other sizes, or relax "
                "min_steps / max_tokens."
            )
        points.extend(kept)
    return points


def isoflop_sweep(
    name: str,
    *,
    budgets: Sequence[float],
    models: Mapping[str, Any],
    vocab_size: int,
    batch_size: int,
    seq_len: int,
    min_steps: int = DEFAULT_MIN_STEPS,
    max_tokens: int | None = None,
    **shared: Any,
) -> list[LazyStep]:
    """``train_lm`` steps for :func:`isoflop_grid`'s points, named ``<name>/<budget>/<model>``.

    ``shared`` holds the other ``train_lm`` arguments (``datasets``, ``optimizer``, ...). Each step
    declares its budget, size, tokens and planned FLOPs in its annotations; ``marin scaling`` reads
    them back to group the runs by budget.
    """
    steps = []
    for point in isoflop_grid(budgets, models, vocab_size=vocab_size, batch_size=batch_size, seq_len=seq_len,
                              min_steps=min_steps, max_tokens=max_tokens):
        step = train_lm(f"{name}/{budget_label(point.budget)}/{point.model_label}", model=point.model,
                        batch_size=batch_size, seq_len=seq_len, num_train_steps=point.num_train_steps, **shared)
        annotations = {
            **step.annotations,
            "flops": point.flops,
            "sweep": {"name": name, "kind": "isoflop", "budget": point.budget, "model": point.model_label,
                      "params": point.params, "tokens": point.tokens, "flops_per_token": point.flops_per_token},
        }
        steps.append(dataclasses.replace(step, annotations=annotations))
    return steps
