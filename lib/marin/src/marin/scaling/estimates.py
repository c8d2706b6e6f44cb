"""What every scaling fit shares: fitted values with their intervals, whether the runs determine
them at all, and the compute-optimal split at a budget.

A bootstrap interval says how tightly the runs pin a value down, but a value can be printed with a
tidy interval and still say nothing: an exponent that sits on the bound the optimizer was given
(every refit lands there too), or a coefficient whose refits spread over orders of magnitude.
Such a value is **not identified**: it is kept with the reason, and an optimum that depends on it
is not given at all (:class:`Optimum` then carries only the reason). An optimum asked for beyond
the largest budget fitted is an extrapolation: it says how far beyond, and its interval shows
what that costs.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from marin.errors import MarinError
from marin.scaling.points import ScalingRun

# An interval whose ends differ by this many powers of ten (a factor of 100) or more gives the
# order of a value, not the value: it is not identified.
ORDERS_OF_MAGNITUDE = 2.0
# An optimum is a size to train next: one uncertain by a factor of ten or more does not say which.
OPTIMUM_ORDERS_OF_MAGNITUDE = 1.0
# A refit counts as on a bound within this relative distance of it (L-BFGS-B projects onto the
# bound exactly; percentiles interpolate between refits that sit there).
BOUND_TOLERANCE = 1e-4


class ScalingFitError(MarinError, ValueError):
    """Runs that cannot support the fit asked for; the message says what is missing."""


@dataclass(frozen=True)
class Estimate:
    """A fitted value and the percentile interval of its bootstrap refits (``low == high == value`` without any).

    ``unidentified`` is empty when the runs determine the value, else why they do not ("at its
    upper bound 5", "its interval spans 36 orders of magnitude").
    """

    value: float
    low: float
    high: float
    unidentified: str = ""

    @property
    def identified(self) -> bool:
        return not self.unidentified

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    @property
    def orders_of_magnitude(self) -> float:
        """How many powers of ten the interval spans (0 without one; inf when it reaches 0)."""
        if self.low == self.high:
            return 0.0
        if self.low <= 0:
            return math.inf
        return math.log10(self.high / self.low)

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"value": self.value, "low": self.low, "high": self.high}
        if self.unidentified:
            record["unidentified"] = self.unidentified
        return record


def estimate(value: float, samples: Any, confidence: float) -> Estimate:
    samples = np.asarray(samples, dtype=float)
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return Estimate(float(value), float(value), float(value))
    tail = 50.0 * (1.0 - confidence)
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return Estimate(float(value), float(low), float(high))


def _near(x: float, bound: float) -> bool:
    return abs(x - bound) <= BOUND_TOLERANCE * max(abs(bound), 1e-12)


def judged(estimate_: Estimate, *, lower: float | None = None, upper: float | None = None,
           lower_means: str = "") -> Estimate:
    """``estimate_`` with ``unidentified`` set when it sits on a bound of the fit, when its interval
    reaches one, or when the interval spans :data:`ORDERS_OF_MAGNITUDE` or more (a positive value).

    ``lower_means`` says what sitting on the lower bound means for this value ("no loss floor").
    """
    for bound, side in ((lower, "lower"), (upper, "upper")):
        if bound is None:
            continue
        meaning = f" ({lower_means})" if side == "lower" and lower_means else ""
        if _near(estimate_.value, bound):
            return replace(estimate_, unidentified=f"at its {side} bound {bound:.3g}{meaning}")
        if _near(estimate_.low if side == "lower" else estimate_.high, bound):
            return replace(estimate_, unidentified=f"its interval reaches the {side} bound {bound:.3g}{meaning}")
    if estimate_.value > 0 and estimate_.orders_of_magnitude >= ORDERS_OF_MAGNITUDE:
        spread = estimate_.orders_of_magnitude
        return replace(estimate_, unidentified=f"its interval spans {spread:.0f} orders of magnitude")
    return estimate_


def unidentified_reasons(named: Sequence[tuple[str, Estimate]]) -> list[str]:
    """``["alpha: at its upper bound 5", "A and B: ..."]``: the values not identified, those sharing a reason named together."""
    by_reason: dict[str, list[str]] = {}
    for name, value in named:
        if value.unidentified:
            by_reason.setdefault(value.unidentified, []).append(name)
    return [f"{' and '.join(names)}: {reason}" for reason, names in by_reason.items()]


@dataclass(frozen=True)
class Optimum:
    """The compute-optimal size and tokens at ``compute`` FLOPs by one fit, with their bootstrap intervals.

    ``largest_budget`` is the largest compute the fit saw; beyond it the optimum is extrapolated
    (``beyond`` times). When the fit does not determine the optimum, ``unidentified`` says why and
    ``params``/``tokens`` are None: nothing is given as if it were known.
    """

    compute: float
    largest_budget: float
    params: Estimate | None
    tokens: Estimate | None
    unidentified: str = ""

    @property
    def beyond(self) -> float:
        """``compute`` over the largest budget fitted: above 1 the optimum is extrapolated."""
        return self.compute / self.largest_budget

    @property
    def extrapolated(self) -> bool:
        return self.beyond > 1.0 + 1e-9

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"flops": self.compute, "largest_budget": self.largest_budget,
                                  "beyond_largest_budget": self.beyond}
        if self.unidentified:
            record["unidentified"] = self.unidentified
            return record
        assert self.params is not None and self.tokens is not None
        return {**record, "params": self.params.to_json(), "tokens": self.tokens.to_json(),
                "tokens_per_param": self.tokens.value / self.params.value}


def optimum_from(compute: float, largest_budget: float, params: float, tokens: float,
                 params_samples: np.ndarray, tokens_samples: np.ndarray, confidence: float,
                 blockers: Sequence[str] = ()) -> Optimum:
    """The optimum at ``compute`` from its point value and bootstrap samples; not identified when
    ``blockers`` name parameters it rests on that are not, or when its own interval spans a factor of
    ten or more (:data:`OPTIMUM_ORDERS_OF_MAGNITUDE`)."""
    if blockers:
        return Optimum(compute, largest_budget, None, None, "; ".join(blockers))
    size, data = estimate(params, params_samples, confidence), estimate(tokens, tokens_samples, confidence)
    for name, value in (("N_opt", size), ("D_opt", data)):
        if value.orders_of_magnitude >= OPTIMUM_ORDERS_OF_MAGNITUDE:
            factor = value.high / value.low if value.low > 0 else math.inf
            return Optimum(compute, largest_budget, None, None,
                           f"{name}'s interval at this budget spans a factor of {factor:.3g}, from {value.low:.3g} to "
                           f"{value.high:.3g}")
    return Optimum(compute, largest_budget, size, data)


def check_runs(runs: Sequence[ScalingRun], what: str) -> tuple[ScalingRun, ...]:
    runs = tuple(runs)
    for run in runs:
        for field in ("params", "tokens", "flops", "loss"):
            value = getattr(run, field)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise ScalingFitError(
                    f"Run {run.name!r} has {field}={value!r}; {what} needs positive, finite params, tokens, flops and "
                    f"loss for every run. Drop the run or fix how it was collected."
                )
    return runs


def check_bootstrap(bootstrap: int, confidence: float) -> None:
    if bootstrap < 0:
        raise ScalingFitError(f"bootstrap={bootstrap}: the number of bootstrap refits must be 0 or more.")
    if not 0.0 < confidence < 1.0:
        raise ScalingFitError(f"confidence={confidence}: the interval's coverage must lie strictly between 0 and 1.")


def flops_per_param_token(runs: Sequence[ScalingRun]) -> float:
    # The runs' own C/(N*D) (about 6 for a dense transformer, more when attention is counted), so
    # the optimum is stated in the same FLOPs the sweep's budgets were planned in.
    return float(np.median([run.flops / (run.params * run.tokens) for run in runs]))


def group_by_budget(runs: Sequence[ScalingRun], *, tolerance: float = 0.25) -> dict[float, list[ScalingRun]]:
    """The runs by IsoFLOP budget, smallest first.

    A declared ``budget`` is used as is. Runs without one are grouped by their own ``flops``: in
    increasing order, a run joins the current group unless its flops exceed the group's first by
    more than a factor ``1 + tolerance``; a group's key is the geometric mean of its flops.
    """
    if tolerance < 0:
        raise ScalingFitError(f"tolerance={tolerance}: the relative FLOP spread of a budget must be 0 or more.")
    groups: dict[float, list[ScalingRun]] = {}
    for run in runs:
        if run.budget is not None:
            groups.setdefault(float(run.budget), []).append(run)
    clusters: list[list[ScalingRun]] = []
    for run in sorted((run for run in runs if run.budget is None), key=lambda run: run.flops):
        if clusters and run.flops <= clusters[-1][0].flops * (1.0 + tolerance):
            clusters[-1].append(run)
        else:
            clusters.append([run])
    for cluster in clusters:
        key = float(np.exp(np.mean(np.log([run.flops for run in cluster]))))
        groups.setdefault(key, []).extend(cluster)
    return dict(sorted(groups.items()))


_Fit = TypeVar("_Fit")


def one_blas_thread(fit: Callable[..., _Fit]) -> Callable[..., _Fit]:
    """Run ``fit`` with the BLAS library on one thread. Its arrays are tiny (a few dozen runs), so
    more threads only wait on each other, and on a busy machine (a sweep training beside the web
    view) they made a fit of a second take tens of seconds."""

    @functools.wraps(fit)
    def single_threaded(*args, **kwargs) -> _Fit:
        with threadpool_limits(limits=1, user_api="blas"):
            return fit(*args, **kwargs)

    return single_threaded
