"""Scaling laws fitted to a sweep's runs: Chinchilla's IsoFLOP parabolas and its parametric loss.

Both answer how a compute budget C is best split between parameters N and tokens D (Hoffmann et
al. 2022, "Training Compute-Optimal Large Language Models"):

* :func:`fit_isoflop` (the paper's "approach 2"): for each budget, a parabola of loss in
  log10(N) through runs of about equal compute; its vertex is that budget's best size. Power
  laws N_opt(C) and D_opt(C) are then fitted through the vertices in log-log.
* :func:`fit_parametric` ("approach 3", Appendix D.2): L(N, D) = E + A/N**alpha + B/D**beta
  fitted to every run by a Huber loss on log L; its optimum under C = k*N*D has a closed form.

Every fitted number is an :class:`Estimate` with a bootstrap interval: the runs are resampled
with replacement and the fit repeated, so a reader sees how tightly the sweep pins each value
down. Results depend only on the runs and the seed.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from marin.errors import MarinError
from marin.scaling.points import ScalingRun

logger = logging.getLogger(__name__)


class ScalingFitError(MarinError, ValueError):
    """Runs that cannot support the fit asked for; the message says what is missing."""


@dataclass(frozen=True)
class Estimate:
    """A fitted value and the percentile interval of its bootstrap refits (``low == high == value`` without any)."""

    value: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _estimate(value: float, samples, confidence: float) -> Estimate:
    samples = np.asarray(samples, dtype=float)
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return Estimate(float(value), float(value), float(value))
    tail = 50.0 * (1.0 - confidence)
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return Estimate(float(value), float(low), float(high))


def _estimate_json(estimate: Estimate) -> dict:
    return {"value": estimate.value, "low": estimate.low, "high": estimate.high}


@dataclass(frozen=True)
class PowerLaw:
    """``y = coefficient * C ** exponent``; calling it uses the point values."""

    coefficient: Estimate
    exponent: Estimate

    def __call__(self, compute: float) -> float:
        return float(self.coefficient.value * compute**self.exponent.value)

    def to_json(self) -> dict:
        return {"coefficient": _estimate_json(self.coefficient), "exponent": _estimate_json(self.exponent)}


def _check_runs(runs: Sequence[ScalingRun], what: str) -> tuple[ScalingRun, ...]:
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


def _check_bootstrap(bootstrap: int, confidence: float) -> None:
    if bootstrap < 0:
        raise ScalingFitError(f"bootstrap={bootstrap}: the number of bootstrap refits must be 0 or more.")
    if not 0.0 < confidence < 1.0:
        raise ScalingFitError(f"confidence={confidence}: the interval's coverage must lie strictly between 0 and 1.")


def _flops_per_param_token(runs: Sequence[ScalingRun]) -> float:
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


# --- IsoFLOP curves ("approach 2") ---------------------------------------------------------------


@dataclass(frozen=True)
class IsoFlopCurve:
    """One budget's parabola ``loss = a*x**2 + b*x + c`` in ``x = log10(params)``, and its vertex.

    ``tokens_opt`` is ``budget / (k * params_opt)`` with k the curve's median C/(N*D).
    """

    budget: float
    coefficients: tuple[float, float, float]
    params_opt: float
    tokens_opt: float
    loss_opt: float
    runs: tuple[ScalingRun, ...]

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
            "runs": [run.name for run in self.runs],
        }


@dataclass(frozen=True)
class IsoFlopFit:
    """The usable IsoFLOP curves (by budget) and the power laws through their vertices."""

    curves: tuple[IsoFlopCurve, ...]
    params_opt: PowerLaw
    tokens_opt: PowerLaw

    def optimal(self, compute: float) -> tuple[float, float]:
        """``(N, D)`` the power laws give for ``compute`` FLOPs."""
        return self.params_opt(compute), self.tokens_opt(compute)

    def to_json(self) -> dict:
        return {
            "method": "isoflop",
            "params_opt": self.params_opt.to_json(),
            "tokens_opt": self.tokens_opt.to_json(),
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


def _power_law(compute: np.ndarray, values: np.ndarray, samples: np.ndarray, confidence: float) -> PowerLaw:
    """A log-log line through ``(compute, values)``; ``samples`` holds bootstrap ``(intercept, slope)`` rows."""
    intercept, slope = _line(np.log10(compute), np.log10(values))
    with np.errstate(over="ignore"):  # a wild refit's coefficient overflows to inf, which the interval leaves out
        coefficients = 10.0 ** samples[:, 0]
    return PowerLaw(
        coefficient=_estimate(10.0**intercept, coefficients, confidence),
        exponent=_estimate(slope, samples[:, 1], confidence),
    )


_Fit = TypeVar("_Fit")


def _one_blas_thread(fit: Callable[..., _Fit]) -> Callable[..., _Fit]:
    """Run ``fit`` with the BLAS library on one thread. Its arrays are tiny (a few dozen runs), so
    more threads only wait on each other, and on a busy machine (a sweep training beside the web
    view) they made a fit of a second take tens of seconds."""

    @functools.wraps(fit)
    def single_threaded(*args, **kwargs) -> _Fit:
        with threadpool_limits(limits=1, user_api="blas"):
            return fit(*args, **kwargs)

    return single_threaded


@_one_blas_thread
def fit_isoflop(runs: Sequence[ScalingRun], *, bootstrap: int = 200, confidence: float = 0.95,
                seed: int = 0) -> IsoFlopFit:
    """Chinchilla's approach 2: per-budget parabolas in log10(N), then N_opt(C), D_opt(C) through their vertices.

    Budgets with fewer than 3 distinct sizes or a downward parabola are skipped with a warning;
    at least 2 usable budgets are needed. The bootstrap resamples the noise around each parabola
    (see :func:`_isoflop_bootstrap`); a resample that leaves a budget without a minimum drops that
    budget from its refit, and a refit left with fewer than 2 budgets is not counted.
    """
    runs = _check_runs(runs, "an IsoFLOP fit")
    _check_bootstrap(bootstrap, confidence)
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
        if not log_params.min() <= x_opt <= log_params.max():
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
            tokens_opt=budget / (_flops_per_param_token(members) * params_opt),
            loss_opt=loss_opt,
            runs=tuple(members),
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
    return IsoFlopFit(
        curves=tuple(curves),
        params_opt=_power_law(budgets, np.array([curve.params_opt for curve in curves]), params_samples, confidence),
        tokens_opt=_power_law(budgets, np.array([curve.tokens_opt for curve in curves]), tokens_samples, confidence),
    )


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
    ratios = [_flops_per_param_token(curve.runs) for curve in curves]
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


# --- Parametric loss ("approach 3") --------------------------------------------------------------

# The paper's grid of initial points: alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1} and
# a, b in {0, 5, ..., 25} (4,500 points). Running L-BFGS-B from each costs seconds per fit, so the
# whole grid is only screened, the objective evaluated at every point in one array operation, and
# the local search starts from the best 8. On synthetic sweeps (3 to 5 budgets, 1 to 2% noise)
# the best of those 8 matched the best of all 4,500 starts to 1e-12 in the objective.
_GRID = np.stack(
    [axis.ravel() for axis in np.meshgrid(
        np.arange(-1.0, 1.01, 0.5),   # e
        np.arange(0.0, 25.1, 5.0),    # a
        np.arange(0.0, 25.1, 5.0),    # b
        np.arange(0.0, 2.01, 0.5),    # alpha
        np.arange(0.0, 2.01, 0.5),    # beta
        indexing="ij",
    )],
    axis=1,
)
_FULL_STARTS = 8
# A resample's minimum is almost always the full-data one moved a little, so its refit starts
# there; the best grid point guards against a resample whose minimum lies in another basin.
_BOOTSTRAP_GRID_STARTS = 1
# Exponents are kept positive (the allocation exponents divide by alpha + beta) and below any
# value a language-model sweep has shown; e above exp(-20), a loss floor of effectively zero.
_BOUNDS = [(-20.0, None), (None, None), (None, None), (1e-3, 5.0), (1e-3, 5.0)]


@dataclass(frozen=True)
class ParametricFit:
    """``L(N, D) = E + A / N**alpha + B / D**beta`` and the compute-optimal split it implies.

    ``flops_per_param_token`` is the k of ``C = k*N*D`` used by :meth:`optimal`. ``refits`` holds
    the successful bootstrap refits as ``(E, A, B, alpha, beta)``, from which the intervals of
    the allocation exponents are drawn at coverage ``confidence``.
    """

    E: Estimate
    A: Estimate
    B: Estimate
    alpha: Estimate
    beta: Estimate
    flops_per_param_token: float
    huber_delta: float
    runs: tuple[ScalingRun, ...]
    refits: tuple[tuple[float, float, float, float, float], ...] = ()
    confidence: float = 0.95

    def loss(self, params, tokens) -> float | np.ndarray:
        params, tokens = np.asarray(params, dtype=float), np.asarray(tokens, dtype=float)
        value = self.E.value + self.A.value / params**self.alpha.value + self.B.value / tokens**self.beta.value
        return float(value) if np.ndim(value) == 0 else value

    def _refit_exponents(self) -> tuple[np.ndarray, np.ndarray]:
        refits = np.array(self.refits, dtype=float).reshape(-1, 5)
        return refits[:, 3], refits[:, 4]

    @property
    def params_exponent(self) -> Estimate:
        """a in N_opt ∝ C**a: beta / (alpha + beta)."""
        alpha, beta = self._refit_exponents()
        value = self.beta.value / (self.alpha.value + self.beta.value)
        return _estimate(value, beta / (alpha + beta), self.confidence)

    @property
    def tokens_exponent(self) -> Estimate:
        """b in D_opt ∝ C**b: alpha / (alpha + beta)."""
        alpha, beta = self._refit_exponents()
        value = self.alpha.value / (self.alpha.value + self.beta.value)
        return _estimate(value, alpha / (alpha + beta), self.confidence)

    def optimal(self, compute: float) -> tuple[float, float]:
        """``(N, D)`` minimizing the loss under ``compute = k*N*D`` (the paper's closed form)."""
        A, B, alpha, beta = self.A.value, self.B.value, self.alpha.value, self.beta.value
        product = compute / self.flops_per_param_token
        scale = (alpha * A / (beta * B)) ** (1.0 / (alpha + beta))
        params = scale * product ** (beta / (alpha + beta))
        return float(params), float(product / params)

    @classmethod
    def from_coefficients(cls, E: float, A: float, B: float, alpha: float, beta: float,
                          flops_per_param_token: float = 6.0) -> ParametricFit:
        """A law from published coefficients: no runs, intervals collapsed to the values.

        ``huber_delta`` records the paper's 1e-3, the value its published coefficients were fitted with.
        """
        def point(value: float) -> Estimate:
            return Estimate(float(value), float(value), float(value))

        return cls(point(E), point(A), point(B), point(alpha), point(beta),
                   flops_per_param_token=float(flops_per_param_token), huber_delta=1e-3, runs=())

    def to_json(self) -> dict:
        return {
            "method": "parametric",
            **{name: _estimate_json(getattr(self, name)) for name in ("E", "A", "B", "alpha", "beta")},
            "params_exponent": _estimate_json(self.params_exponent),
            "tokens_exponent": _estimate_json(self.tokens_exponent),
            "flops_per_param_token": self.flops_per_param_token,
            "huber_delta": self.huber_delta,
            "confidence": self.confidence,
            "bootstrap_refits": len(self.refits),
            "runs": [run.name for run in self.runs],
        }


class _Objective:
    """Sum of Huber losses of ``log L_hat - log L`` and its gradient, for one set of runs.

    Inside, ``log N`` and ``log D`` are centred on their means (``a`` and ``b`` shift to match),
    which decorrelates each coefficient from its exponent and lets L-BFGS-B converge in far
    fewer steps; the minimum is the same. The sum is divided by ``delta**2``, which leaves the
    minimizer alone but keeps the values near 1 rather than 1e-6, where the optimizer's stopping
    tests would end the search early.
    """

    def __init__(self, log_params: np.ndarray, log_tokens: np.ndarray, log_loss: np.ndarray, delta: float):
        self.params_mean, self.tokens_mean = float(log_params.mean()), float(log_tokens.mean())
        self.log_params = log_params - self.params_mean
        self.log_tokens = log_tokens - self.tokens_mean
        self.log_loss = log_loss
        self.delta = delta

    def centred(self, theta: np.ndarray) -> np.ndarray:
        e, a, b, alpha, beta = theta
        return np.array([e, a - alpha * self.params_mean, b - beta * self.tokens_mean, alpha, beta])

    def uncentred(self, theta: np.ndarray) -> np.ndarray:
        e, a, b, alpha, beta = theta
        return np.array([e, a + alpha * self.params_mean, b + beta * self.tokens_mean, alpha, beta])

    def screen(self, grid: np.ndarray) -> np.ndarray:
        """The objective at each row of ``grid`` (uncentred parameters), all at once."""
        e, a, b, alpha, beta = (grid[:, i : i + 1] for i in range(5))
        terms = (a - alpha * self.params_mean - alpha * self.log_params,
                 b - beta * self.tokens_mean - beta * self.log_tokens,
                 np.broadcast_to(e, (grid.shape[0], self.log_params.size)))
        residual = np.logaddexp(np.logaddexp(terms[0], terms[1]), terms[2]) - self.log_loss
        return self._huber(residual).sum(axis=1)

    def _huber(self, residual: np.ndarray) -> np.ndarray:
        size = np.abs(residual)
        delta = self.delta
        return np.where(size <= delta, 0.5 * residual**2, delta * (size - 0.5 * delta)) / delta**2

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        e, a, b, alpha, beta = theta
        size_term = a - alpha * self.log_params
        data_term = b - beta * self.log_tokens
        top = np.maximum(np.maximum(size_term, data_term), e)
        size_weight, data_weight, floor_weight = np.exp(size_term - top), np.exp(data_term - top), np.exp(e - top)
        total = size_weight + data_weight + floor_weight
        residual = top + np.log(total) - self.log_loss
        # d(huber)/d(residual), times the 1/total that turns the weights into d(logsumexp)/d(term).
        slope = np.clip(residual, -self.delta, self.delta) / (self.delta**2 * total)
        size_slope, data_slope = slope * size_weight, slope * data_weight
        grad = np.array([
            slope @ floor_weight,
            size_slope.sum(),
            data_slope.sum(),
            -(size_slope @ self.log_params),
            -(data_slope @ self.log_tokens),
        ])
        return float(self._huber(residual).sum()), grad

    def minimize(self, starts: Sequence[np.ndarray]) -> tuple[np.ndarray, float] | None:
        """The best local minimum (uncentred parameters, objective) from ``starts``, or None."""
        best: tuple[np.ndarray, float] | None = None
        for start in starts:
            result = minimize(self, self.centred(start), jac=True, method="L-BFGS-B", bounds=_BOUNDS,
                              options={"maxiter": 1000})
            if np.all(np.isfinite(result.x)) and np.isfinite(result.fun) and (best is None or result.fun < best[1]):
                best = (self.uncentred(result.x), float(result.fun))
        return best

    def grid_starts(self, count: int) -> list[np.ndarray]:
        return list(_GRID[np.argsort(self.screen(_GRID), kind="stable")[:count]])


def _objective(runs: Sequence[ScalingRun], delta: float) -> _Objective:
    return _Objective(
        np.log([run.params for run in runs]),
        np.log([run.tokens for run in runs]),
        np.log([run.loss for run in runs]),
        delta,
    )


@_one_blas_thread
def fit_parametric(runs: Sequence[ScalingRun], *, bootstrap: int = 100, confidence: float = 0.95,
                   huber_delta: float = 1e-3, seed: int = 0) -> ParametricFit:
    """Chinchilla's approach 3: ``E + A/N**alpha + B/D**beta`` by Huber loss on log loss, L-BFGS-B from a grid.

    Needs at least 5 runs with at least 2 distinct sizes and 2 distinct token counts. Each
    bootstrap refit resamples all runs with replacement and starts from the full-data solution
    and the best grid point.
    """
    runs = _check_runs(runs, "a parametric fit")
    _check_bootstrap(bootstrap, confidence)
    if not huber_delta > 0:
        raise ScalingFitError(
            f"huber_delta={huber_delta}: the Huber loss's threshold must be positive (the paper uses 1e-3)."
        )
    sizes = len({run.params for run in runs})
    token_counts = len({run.tokens for run in runs})
    if len(runs) < 5 or sizes < 2 or token_counts < 2:
        raise ScalingFitError(
            f"A parametric fit has 5 coefficients and needs at least 5 runs with at least 2 distinct model sizes and "
            f"2 distinct token counts; got {len(runs)} run(s), {sizes} size(s), {token_counts} token count(s). "
            f"Add runs that vary the size and the tokens trained."
        )
    objective = _objective(runs, huber_delta)
    grid_starts = objective.grid_starts(_FULL_STARTS)
    found = objective.minimize(grid_starts)
    if found is None:
        raise ScalingFitError(
            f"The parametric fit did not converge from any starting point on {len(runs)} runs; check the losses "
            f"for outliers (diverged runs) and units (nats per token)."
        )
    best = found[0]
    rng = np.random.default_rng(seed)
    params = np.array([run.params for run in runs])
    tokens = np.array([run.tokens for run in runs])
    refits: list[tuple[float, float, float, float, float]] = []
    for _ in range(bootstrap):
        pick = rng.integers(0, len(runs), len(runs))
        if np.unique(params[pick]).size < 2 or np.unique(tokens[pick]).size < 2:
            continue
        resample = _objective([runs[i] for i in pick], huber_delta)
        refit = resample.minimize([best, *grid_starts[:_BOOTSTRAP_GRID_STARTS]])
        if refit is not None:
            e, a, b, alpha, beta = refit[0]
            refits.append((math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta)))
    samples = np.array(refits, dtype=float).reshape(-1, 5)
    e, a, b, alpha, beta = best
    values = (math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta))
    E, A, B, alpha_estimate, beta_estimate = (_estimate(values[i], samples[:, i], confidence) for i in range(5))
    return ParametricFit(
        E=E, A=A, B=B, alpha=alpha_estimate, beta=beta_estimate,
        flops_per_param_token=_flops_per_param_token(runs),
        huber_delta=float(huber_delta),
        runs=runs,
        refits=tuple(refits),
        confidence=float(confidence),
    )
