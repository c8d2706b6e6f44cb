"""Chinchilla's IsoFLOP parabolas ("approach 2", Hoffmann et al. 2022, "Training Compute-Optimal
Large Language Models"): for each budget, a parabola of loss in log10(N) through runs of about equal
compute; its vertex is that budget's best size. Power laws N_opt(C) and D_opt(C) are then fitted
through the vertices in log-log.

What the runs cannot tell is said, not printed as a number: a vertex outside the sizes tried is
marked as extrapolated, an allocation exponent whose interval leaves 0 to 1 (the runs do not say
whether N and D both grow with compute) is not identified, and so is no optimum resting on it
(:mod:`marin.scaling.estimates`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from marin.scaling.estimates import (
    Estimate,
    Optimum,
    ScalingFitError,
    check_bootstrap,
    check_runs,
    estimate,
    flops_per_param_token,
    group_by_budget,
    one_blas_thread,
    optimum_from,
    unidentified_reasons,
)
from marin.scaling.points import ScalingRun

logger = logging.getLogger("marin.scaling.fits")


@dataclass(frozen=True)
class PowerLaw:
    """``y = coefficient * C ** exponent``; calling it uses the point values.

    ``samples`` holds the bootstrap refits' ``(log10 coefficient, exponent)``, from which
    :meth:`interval_at` draws the spread of ``y`` at any compute.
    """

    coefficient: Estimate
    exponent: Estimate
    samples: tuple[tuple[float, float], ...] = ()

    def __call__(self, compute: float) -> float:
        return float(self.coefficient.value * compute**self.exponent.value)

    def samples_at(self, compute: float) -> np.ndarray:
        rows = np.array(self.samples, dtype=float).reshape(-1, 2)
        with np.errstate(over="ignore"):  # a wild refit overflows to inf, which an interval leaves out
            return 10.0 ** (rows[:, 0] + rows[:, 1] * math.log10(compute))

    def to_json(self) -> dict:
        return {"coefficient": self.coefficient.to_json(), "exponent": self.exponent.to_json()}


@dataclass(frozen=True)
class IsoFlopCurve:
    """One budget's parabola ``loss = a*x**2 + b*x + c`` in ``x = log10(params)``, and its vertex.

    ``tokens_opt`` is ``budget / (k * params_opt)`` with k the curve's median C/(N*D).
    ``extrapolated``: the vertex lies outside the sizes tried, so only the parabola's shape puts it there.
    """

    budget: float
    coefficients: tuple[float, float, float]
    params_opt: float
    tokens_opt: float
    loss_opt: float
    runs: tuple[ScalingRun, ...]
    extrapolated: bool = False

    def loss_at(self, params: float) -> float:
        a, b, c = self.coefficients
        x = np.log10(params)
        return float(a * x * x + b * x + c)

    def to_json(self) -> dict:
        return {
            "budget": self.budget,
            "coefficients": list(self.coefficients),
            "params_opt": self.params_opt,
            "tokens_opt": self.tokens_opt,
            "loss_opt": self.loss_opt,
            "extrapolated": self.extrapolated,
            "runs": [run.name for run in self.runs],
        }


@dataclass(frozen=True)
class IsoFlopFit:
    """The usable IsoFLOP curves (by budget) and the power laws through their vertices."""

    curves: tuple[IsoFlopCurve, ...]
    params_opt: PowerLaw
    tokens_opt: PowerLaw
    confidence: float = 0.95

    @property
    def largest_budget(self) -> float:
        return max(curve.budget for curve in self.curves)

    def optimal(self, compute: float) -> tuple[float, float]:
        """``(N, D)`` the power laws give for ``compute`` FLOPs (point values; :meth:`optimum` says how well known)."""
        return self.params_opt(compute), self.tokens_opt(compute)

    def optimum(self, compute: float) -> Optimum:
        """The optimum at ``compute`` with its interval, or why the fit does not determine it."""
        blockers = unidentified_reasons([("the N_opt exponent", self.params_opt.exponent),
                                         ("the D_opt exponent", self.tokens_opt.exponent)])
        return optimum_from(compute, self.largest_budget, *self.optimal(compute), self.params_opt.samples_at(compute),
                            self.tokens_opt.samples_at(compute), self.confidence, blockers)

    def to_json(self) -> dict:
        return {
            "method": "isoflop",
            "params_opt": self.params_opt.to_json(),
            "tokens_opt": self.tokens_opt.to_json(),
            "largest_budget": self.largest_budget,
            "confidence": self.confidence,
            "curves": [curve.to_json() for curve in self.curves],
        }


def _parabola(log_params: np.ndarray, losses: np.ndarray) -> tuple[tuple[float, float, float] | None, str]:
    """Least-squares coefficients, or None and the reason the budget cannot give a minimum."""
    sizes = np.unique(log_params).size
    if sizes < 3:
        return None, f"only {sizes} distinct model size(s), and a parabola needs at least 3"
    a, b, c = np.polyfit(log_params, losses, 2)
    if not a > 0:
        return None, "its parabola opens downward, so it has no minimum (the sizes tried do not bracket the best one)"
    return (float(a), float(b), float(c)), ""


def _vertex(coefficients: tuple[float, float, float]) -> tuple[float, float]:
    a, b, c = coefficients
    return -b / (2.0 * a), c - b * b / (4.0 * a)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line."""
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def _judged_exponent(exponent: Estimate) -> Estimate:
    # N_opt = G C^a and D_opt = C / (k N_opt) = C^(1-a) / (k G): both grow with compute only for a in
    # [0, 1]. An interval beyond that does not say which of N and D to grow, whatever its width.
    if exponent.low < 0.0 or exponent.high > 1.0:
        return replace(exponent, unidentified=f"its interval [{exponent.low:.3g}, {exponent.high:.3g}] goes beyond 0 "
                                              f"to 1 (the runs do not say whether N and D both grow with compute)")
    return exponent


def _power_law(compute: np.ndarray, values: np.ndarray, samples: np.ndarray, confidence: float) -> PowerLaw:
    """A log-log line through ``(compute, values)``; ``samples`` holds bootstrap ``(intercept, slope)`` rows."""
    intercept, slope = _line(np.log10(compute), np.log10(values))
    with np.errstate(over="ignore"):  # a wild refit's coefficient overflows to inf, which the interval leaves out
        coefficients = 10.0 ** samples[:, 0]
    return PowerLaw(
        coefficient=estimate(10.0**intercept, coefficients, confidence),
        exponent=_judged_exponent(estimate(slope, samples[:, 1], confidence)),
        samples=tuple((float(i), float(s)) for i, s in samples),
    )


@one_blas_thread
def fit_isoflop(runs: Sequence[ScalingRun], *, bootstrap: int = 200, confidence: float = 0.95,
                seed: int = 0) -> IsoFlopFit:
    """Chinchilla's approach 2: per-budget parabolas in log10(N), then N_opt(C), D_opt(C) through their vertices.

    Budgets with fewer than 3 distinct sizes or a downward parabola are skipped with a warning;
    at least 2 usable budgets are needed. The bootstrap resamples the noise around each parabola
    (see :func:`_isoflop_bootstrap`); a resample that leaves a budget without a minimum drops that
    budget from its refit, and a refit left with fewer than 2 budgets is not counted.
    """
    runs = check_runs(runs, "an IsoFLOP fit")
    check_bootstrap(bootstrap, confidence)
    groups = group_by_budget(runs)
    curves: list[IsoFlopCurve] = []
    skipped: list[str] = []
    for budget, members in groups.items():
        log_params = np.log10([run.params for run in members])
        coefficients, reason = _parabola(log_params, np.array([run.loss for run in members]))
        if coefficients is None:
            logger.warning("IsoFLOP fit: skipping the %.3g FLOP budget (%d runs): %s.", budget, len(members), reason)
            skipped.append(f"{budget:.3g} FLOPs: {reason}")
            continue
        x_opt, loss_opt = _vertex(coefficients)
        extrapolated = not log_params.min() <= x_opt <= log_params.max()
        if extrapolated:
            logger.warning(
                "IsoFLOP fit: the best size for the %.3g FLOP budget, %.3g params, lies outside the sizes tried "
                "(%.3g to %.3g); it is extrapolated, so add runs beyond that end.",
                budget, 10.0**x_opt, 10.0 ** log_params.min(), 10.0 ** log_params.max(),
            )
        params_opt = 10.0**x_opt
        curves.append(IsoFlopCurve(
            budget=budget,
            coefficients=coefficients,
            params_opt=params_opt,
            tokens_opt=budget / (flops_per_param_token(members) * params_opt),
            loss_opt=loss_opt,
            runs=tuple(members),
            extrapolated=extrapolated,
        ))
    if len(curves) < 2:
        why = "".join(f"\n  - {line}" for line in skipped)
        raise ScalingFitError(
            f"An IsoFLOP fit needs at least 2 budgets, each with runs of 3 or more distinct sizes whose losses "
            f"bottom out between the smallest and largest; the {len(runs)} run(s) form {len(groups)} budget(s), "
            f"of which {len(curves)} usable.{why}\nAdd sizes on either side of each budget's best run, or more budgets."
        )
    budgets = np.array([curve.budget for curve in curves])
    params_samples, tokens_samples = _isoflop_bootstrap(curves, bootstrap, seed)
    laws = [_power_law(budgets, np.array(values), samples, confidence) for values, samples in (
        ([curve.params_opt for curve in curves], params_samples), ([curve.tokens_opt for curve in curves], tokens_samples))]
    if bootstrap and not len(params_samples):
        # Intervals were asked for and none could be drawn: the exponent's spread is unknown, not zero.
        why = ("no interval: every budget's parabola passes through its runs exactly (3 sizes each), so the noise "
               "cannot be estimated; add a fourth size")
        laws = [replace(law, exponent=replace(law.exponent, unidentified=why)) for law in laws]
    return IsoFlopFit(curves=tuple(curves), params_opt=laws[0], tokens_opt=laws[1], confidence=float(confidence))


def _isoflop_bootstrap(curves: list[IsoFlopCurve], bootstrap: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap ``(intercept, slope)`` rows of the log-log lines for N_opt and D_opt.

    The sizes of an IsoFLOP curve are chosen, not sampled, so the resampling keeps them and
    resamples the noise: each refit adds residuals drawn from all curves' residuals (pooled, each
    scaled by ``sqrt(n / (n - 3))`` for the three coefficients its curve fitted) to the fitted
    parabolas. Resampling the runs themselves would often leave a curve of five runs with three
    distinct sizes, whose vertex can then land anywhere: intervals wider than the sweep warrants.
    Pooling lets a curve of exactly three runs (which its parabola fits exactly) vary too, by the
    noise its neighbours show.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    pooled: list[float] = []
    for curve in curves:
        log_n = np.log10([run.params for run in curve.runs])
        losses = np.array([run.loss for run in curve.runs])
        fitted = np.polyval(curve.coefficients, log_n)
        if log_n.size > 3:
            pooled.extend((losses - fitted) * math.sqrt(log_n.size / (log_n.size - 3)))
        arrays.append((log_n, fitted))
    residuals = np.array(pooled)
    if bootstrap and not np.any(residuals):
        logger.warning("IsoFLOP fit: every budget's parabola passes through its runs exactly (3 sizes each), so the "
                       "noise cannot be estimated and the intervals collapse to the fitted values; add a fourth size.")
        return np.empty((0, 2)), np.empty((0, 2))
    ratios = [flops_per_param_token(curve.runs) for curve in curves]
    params_rows, tokens_rows = [], []
    for _ in range(bootstrap):
        log_budgets, log_params, log_tokens = [], [], []
        for curve, (log_n, fitted), ratio in zip(curves, arrays, ratios):
            coefficients, _ = _parabola(log_n, fitted + rng.choice(residuals, log_n.size))
            if coefficients is None:
                continue
            x_opt, _ = _vertex(coefficients)
            log_budgets.append(math.log10(curve.budget))
            log_params.append(x_opt)
            log_tokens.append(math.log10(curve.budget / ratio) - x_opt)
        if len(log_budgets) >= 2:
            params_rows.append(_line(np.array(log_budgets), np.array(log_params)))
            tokens_rows.append(_line(np.array(log_budgets), np.array(log_tokens)))
    if bootstrap and len(params_rows) < bootstrap / 2:
        logger.warning(
            "IsoFLOP fit: only %d of %d bootstrap resamples gave 2 or more usable budgets; the intervals are rough.",
            len(params_rows), bootstrap,
        )
    return np.array(params_rows).reshape(-1, 2), np.array(tokens_rows).reshape(-1, 2)
