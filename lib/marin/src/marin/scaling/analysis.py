"""A prefix's runs and both fits at once: what ``marin scaling`` prints and the web view draws.

Each fit is tried on its own: a sweep with one budget has no IsoFLOP law but may still have a
parametric one, so a fit that cannot be made is kept as the reason why, beside the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marin.scaling.fits import IsoFlopFit, Optimum, ParametricFit, ScalingFitError, fit_isoflop, fit_parametric
from marin.scaling.runs import CollectedRuns, collect_runs


@dataclass(frozen=True)
class ScalingAnalysis:
    prefix: str
    steps: str | None
    collected: CollectedRuns
    isoflop: IsoFlopFit | None
    isoflop_error: str | None
    parametric: ParametricFit | None
    parametric_error: str | None

    def default_budgets(self) -> list[float]:
        """The sweep's largest budget and ten and a hundred times it: where the next runs would go."""
        largest = max((run.budget or run.flops for run in self.collected.runs), default=None)
        return [] if largest is None else [largest, 10 * largest, 100 * largest]

    def optimal_at(self, budgets: Sequence[float]) -> list[dict[str, Any]]:
        """The compute-optimal size and tokens at each budget, by each fit that was made: an
        :class:`~marin.scaling.fits.Optimum` each, with its interval and how far beyond the runs it
        reaches, or only why the fit does not determine it."""
        rows = []
        for budget in budgets:
            row: dict[str, Any] = {"flops": budget}
            for name, fit in (("isoflop", self.isoflop), ("parametric", self.parametric)):
                if fit is not None:
                    row[name] = fit.optimum(budget)
            rows.append(row)
        return rows

    def to_json(self, budgets: Sequence[float] = ()) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "steps": self.steps,
            "runs": [vars(run) for run in self.collected.runs],
            "skipped": [vars(skip) for skip in self.collected.skipped],
            "notes": self.collected.notes,
            "isoflop": self.isoflop.to_json() if self.isoflop is not None else None,
            "isoflop_error": self.isoflop_error,
            "parametric": self.parametric.to_json() if self.parametric is not None else None,
            "parametric_error": self.parametric_error,
            "optimal": [{key: value.to_json() if isinstance(value, Optimum) else value for key, value in row.items()}
                        for row in self.optimal_at(budgets)],
        }


def analyse(prefix: str, *, steps: str | None = None, validation: str | None = None, bootstrap: int = 100,
            seed: int = 0, mixed: bool = False) -> ScalingAnalysis:
    """Collect the finished runs under ``prefix`` (matching the glob ``steps``; alike in all but size
    and budget unless ``mixed``) and fit both laws."""
    collected = collect_runs(prefix, steps=steps, validation=validation, mixed=mixed)
    isoflop = parametric = None
    isoflop_error = parametric_error = None
    try:
        isoflop = fit_isoflop(collected.runs, bootstrap=bootstrap, seed=seed)
    except ScalingFitError as exc:
        isoflop_error = str(exc)
    try:
        parametric = fit_parametric(collected.runs, bootstrap=bootstrap, seed=seed)
    except ScalingFitError as exc:
        parametric_error = str(exc)
    return ScalingAnalysis(prefix, steps, collected, isoflop, isoflop_error, parametric, parametric_error)
