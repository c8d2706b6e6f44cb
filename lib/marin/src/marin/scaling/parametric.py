"""Chinchilla's parametric loss ("approach 3", Hoffmann et al. 2022, Appendix D.2):
``L(N, D) = E + A/N**alpha + B/D**beta`` fitted to every run by a Huber loss on log L; its optimum
under ``C = k*N*D`` has a closed form.

Every coefficient comes with a bootstrap interval (the runs resampled with replacement and the fit
repeated) and is judged (:func:`marin.scaling.estimates.judged`): an exponent on the bound the
optimizer was given, a loss floor at zero, or a value whose refits spread over orders of magnitude
is not identified, and no optimum resting on such a value (A, B, alpha, beta) is given. Results
depend only on the runs and the seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import minimize

from marin.scaling.estimates import (
    Estimate,
    Optimum,
    ScalingFitError,
    check_bootstrap,
    check_runs,
    estimate,
    flops_per_param_token,
    judged,
    one_blas_thread,
    optimum_from,
    unidentified_reasons,
)
from marin.scaling.points import ScalingRun

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
# The same bounds as the coefficients see them, for telling a value the runs determine from one the
# optimizer was stopped at.
_E_FLOOR = math.exp(_BOUNDS[0][0])
_EXPONENT_BOUNDS = _BOUNDS[3]
# The coefficients the compute-optimal split rests on (E only shifts the loss).
_OPTIMUM_RESTS_ON = ("A", "B", "alpha", "beta")
# A term of the law whose share of the predicted loss changes by less than this across the runs has
# no shape the runs can see (it acts as a constant, or as nothing): its coefficient and exponent can
# take any values that keep it so, and whatever the optimizer stopped at says nothing.
_VISIBLE_SHARE = 1e-3


@dataclass(frozen=True)
class ParametricFit:
    """``L(N, D) = E + A / N**alpha + B / D**beta`` and the compute-optimal split it implies.

    ``flops_per_param_token`` is the k of ``C = k*N*D`` used by :meth:`optimal`. ``refits`` holds
    the successful bootstrap refits as ``(E, A, B, alpha, beta)``, from which the intervals of
    the allocation exponents and of :meth:`optimum` are drawn at coverage ``confidence``. Each
    coefficient's ``unidentified`` says why the runs do not determine it, when they do not; a law
    made from published coefficients has no runs, so nothing of it is judged.
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

    def _refits(self) -> np.ndarray:
        return np.array(self.refits, dtype=float).reshape(-1, 5)

    def _allocation_exponent(self, numerator: str) -> Estimate:
        refits = self._refits()
        alpha, beta = refits[:, 3], refits[:, 4]
        top = beta if numerator == "beta" else alpha
        value = getattr(self, numerator).value / (self.alpha.value + self.beta.value)
        exponent = estimate(value, top / (alpha + beta), self.confidence)
        return replace(exponent, unidentified="; ".join(self.unidentified(("alpha", "beta"))))

    @property
    def params_exponent(self) -> Estimate:
        """a in N_opt ∝ C**a: beta / (alpha + beta); not identified with alpha or beta."""
        return self._allocation_exponent("beta")

    @property
    def tokens_exponent(self) -> Estimate:
        """b in D_opt ∝ C**b: alpha / (alpha + beta); not identified with alpha or beta."""
        return self._allocation_exponent("alpha")

    def unidentified(self, names: Sequence[str] = ("E", "A", "B", "alpha", "beta")) -> list[str]:
        """``"alpha: at its upper bound 5"``, for the values of ``names`` the runs do not determine."""
        return unidentified_reasons([(name, getattr(self, name)) for name in names])

    @property
    def largest_budget(self) -> float:
        return max((run.budget or run.flops for run in self.runs), default=math.inf)

    def optimal(self, compute: float) -> tuple[float, float]:
        """``(N, D)`` minimizing the loss under ``compute = k*N*D`` (the paper's closed form), from the
        point values; :meth:`optimum` says whether the runs determine it, and how well."""
        params, tokens = _closed_form(compute / self.flops_per_param_token, self.A.value, self.B.value,
                                      self.alpha.value, self.beta.value)
        return float(params), float(tokens)

    def optimum(self, compute: float) -> Optimum:
        """The optimum at ``compute`` with its interval over the bootstrap refits, or why it is not identified."""
        refits = self._refits()
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # a wild refit's optimum leaves the interval
            params, tokens = _closed_form(compute / self.flops_per_param_token, refits[:, 1], refits[:, 2],
                                          refits[:, 3], refits[:, 4])
        return optimum_from(compute, self.largest_budget, *self.optimal(compute), params, tokens, self.confidence,
                            self.unidentified(_OPTIMUM_RESTS_ON))

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
            **{name: getattr(self, name).to_json() for name in ("E", "A", "B", "alpha", "beta")},
            "params_exponent": self.params_exponent.to_json(),
            "tokens_exponent": self.tokens_exponent.to_json(),
            "largest_budget": self.largest_budget if self.runs else None,
            "flops_per_param_token": self.flops_per_param_token,
            "huber_delta": self.huber_delta,
            "confidence": self.confidence,
            "bootstrap_refits": len(self.refits),
            "runs": [run.name for run in self.runs],
        }


def _closed_form(product, A, B, alpha, beta):
    """``(N, D)`` minimizing ``A/N**alpha + B/D**beta`` under ``N * D = product`` (arrays or floats)."""
    scale = (alpha * A / (beta * B)) ** (1.0 / (alpha + beta))
    params = scale * product ** (beta / (alpha + beta))
    return params, product / params


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
        # The three terms (floor e, size a - alpha log N, data b - beta log D) of every run as one linear
        # map of the centred parameters, rows (term, run): an evaluation is then a few array operations
        # on a (3, runs) block. The bootstrap's refits evaluate it some hundred thousand times, where
        # each NumPy call's overhead outweighs its arithmetic on a few dozen runs.
        runs = log_loss.size
        design = np.zeros((3, runs, 5))
        design[0, :, 0] = design[1, :, 1] = design[2, :, 2] = 1.0
        design[1, :, 3], design[2, :, 4] = -self.log_params, -self.log_tokens
        self.design = design.reshape(3 * runs, 5)

    def centred(self, theta: np.ndarray) -> np.ndarray:
        """``theta`` (one set of parameters, or one per row) with ``a`` and ``b`` shifted to the centred logs."""
        return self._shifted(theta, -1.0)

    def uncentred(self, theta: np.ndarray) -> np.ndarray:
        return self._shifted(theta, 1.0)

    def _shifted(self, theta: np.ndarray, sign: float) -> np.ndarray:
        theta = np.asarray(theta, dtype=float)
        shifted = theta.copy()
        shifted[..., 1] += sign * theta[..., 3] * self.params_mean
        shifted[..., 2] += sign * theta[..., 4] * self.tokens_mean
        return shifted

    def screen(self, grid: np.ndarray) -> np.ndarray:
        """The objective at each row of ``grid`` (uncentred parameters), all at once."""
        floor, size, data = (self.design @ self.centred(grid).T).reshape(3, self.log_loss.size, len(grid))
        residual = np.logaddexp(np.logaddexp(size, data), floor).T - self.log_loss
        return self._huber(residual).sum(axis=1)

    def _huber(self, residual: np.ndarray, clipped: np.ndarray | None = None) -> np.ndarray:
        # With c the residual clipped to [-delta, delta], c * (r - c/2) is r**2/2 inside and
        # delta * (|r| - delta/2) outside: the Huber loss, from the clip the gradient needs anyway.
        if clipped is None:
            clipped = np.clip(residual, -self.delta, self.delta)
        return clipped * (residual - 0.5 * clipped) / self.delta**2

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        terms = (self.design @ theta).reshape(3, -1)  # (term, run)
        top = terms.max(axis=0)
        weights = np.exp(terms - top)
        total = weights.sum(axis=0)
        residual = top + np.log(total) - self.log_loss
        clipped = np.clip(residual, -self.delta, self.delta)
        # d(huber)/d(residual), times the 1/total that turns the weights into d(logsumexp)/d(term).
        slope = clipped / (self.delta**2 * total)
        grad = (weights * slope).reshape(-1) @ self.design
        return float(self._huber(residual, clipped).sum()), grad

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


@one_blas_thread
def fit_parametric(runs: Sequence[ScalingRun], *, bootstrap: int = 100, confidence: float = 0.95,
                   huber_delta: float = 1e-3, seed: int = 0) -> ParametricFit:
    """Chinchilla's approach 3: ``E + A/N**alpha + B/D**beta`` by Huber loss on log loss, L-BFGS-B from a grid.

    Needs at least 5 runs with at least 2 distinct sizes and 2 distinct token counts. Each
    bootstrap refit resamples all runs with replacement and starts from the full-data solution
    and the best grid point.
    """
    runs = check_runs(runs, "a parametric fit")
    check_bootstrap(bootstrap, confidence)
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
    fitted = dict(zip(("E", "A", "B", "alpha", "beta"), (estimate(v, samples[:, i], confidence) for i, v in enumerate(values))))
    fitted["E"] = judged(fitted["E"], lower=_E_FLOOR, lower_means="no loss floor")
    for name in ("alpha", "beta"):
        fitted[name] = judged(fitted[name], lower=_EXPONENT_BOUNDS[0], upper=_EXPONENT_BOUNDS[1])
    for name, reason in _coefficient_reasons(values, samples, params, tokens, confidence, fitted).items():
        fitted[name] = replace(fitted[name], unidentified=reason)
    for name, reason in _invisible_terms(values, params, tokens).items():
        fitted[name] = replace(fitted[name], unidentified=reason)
    return ParametricFit(
        **fitted,
        flops_per_param_token=flops_per_param_token(runs),
        huber_delta=float(huber_delta),
        runs=runs,
        refits=tuple(refits),
        confidence=float(confidence),
    )


def _coefficient_reasons(values: Sequence[float], samples: np.ndarray, params: np.ndarray, tokens: np.ndarray,
                         confidence: float, fitted: dict[str, Estimate]) -> dict[str, str]:
    """Why A or B is not identified, judged where the runs are: A is what its term is at N = 1, so its
    interval there mostly carries alpha's (a small change of alpha moves A by N**alpha). What the runs
    pin is the term at their own scale, A / Nbar**alpha at the geometric-mean size Nbar (and B at
    Dbar): not identified when that spans orders of magnitude across the refits, or when its exponent
    is not identified, since A means nothing without it."""
    reasons: dict[str, str] = {}
    for name, column, exponent, sizes, symbol in (("A", 1, "alpha", params, "N"), ("B", 2, "beta", tokens, "D")):
        if fitted[exponent].unidentified:
            reasons[name] = f"rests on {exponent}, which is not identified"
            continue
        typical = float(np.exp(np.mean(np.log(sizes))))
        at_scale = estimate(values[column] / typical ** values[column + 2],
                            samples[:, column] / typical ** samples[:, column + 2], confidence)
        if judged(at_scale).unidentified:
            reasons[name] = (f"its term at the runs' typical {symbol} ({typical:.3g}) spans "
                             f"{at_scale.orders_of_magnitude:.0f} orders of magnitude across the refits")
    return reasons


def _invisible_terms(values: Sequence[float], params: np.ndarray, tokens: np.ndarray) -> dict[str, str]:
    """Why each coefficient of a term the runs cannot see is not identified (see :data:`_VISIBLE_SHARE`)."""
    E, A, B, alpha, beta = values
    size_term, data_term = A / params**alpha, B / tokens**beta
    predicted = E + size_term + data_term
    reasons: dict[str, str] = {}
    for names, term, formula, what in ((("A", "alpha"), size_term, "A/N^alpha", "size"),
                                       (("B", "beta"), data_term, "B/D^beta", "tokens")):
        share = term / predicted
        if share.max() - share.min() < _VISIBLE_SHARE:
            reason = (f"{formula} changes by less than {_VISIBLE_SHARE:.1%} of the loss across the runs, so they do not "
                      f"show how loss falls with {what}")
            reasons.update(dict.fromkeys(names, reason))
    return reasons
