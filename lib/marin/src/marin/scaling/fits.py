"""Scaling laws fitted to a sweep's runs: Chinchilla's IsoFLOP parabolas and its parametric loss.

Both answer how a compute budget C is best split between parameters N and tokens D (Hoffmann et
al. 2022, "Training Compute-Optimal Large Language Models"):

* :func:`fit_isoflop` (the paper's "approach 2", :mod:`marin.scaling.isoflop`): for each budget, a
  parabola of loss in log10(N) through runs of about equal compute; power laws N_opt(C) and
  D_opt(C) through the vertices.
* :func:`fit_parametric` ("approach 3", :mod:`marin.scaling.parametric`): L(N, D) = E + A/N**alpha
  + B/D**beta fitted to every run; its optimum under C = k*N*D has a closed form.

Every fitted number is an :class:`Estimate` with a bootstrap interval and a verdict on whether the
runs determine it; each fit's ``optimum(C)`` is an :class:`Optimum` that gives N and D with their
intervals, flags an extrapolation beyond the largest budget fitted, and gives no numbers where the
fit does not determine them (:mod:`marin.scaling.estimates`). This module is where callers import
them from.
"""

from marin.scaling.estimates import Estimate, Optimum, ScalingFitError, group_by_budget
from marin.scaling.isoflop import IsoFlopCurve, IsoFlopFit, PowerLaw, fit_isoflop
from marin.scaling.parametric import ParametricFit, fit_parametric

__all__ = [
    "Estimate",
    "IsoFlopCurve",
    "IsoFlopFit",
    "Optimum",
    "ParametricFit",
    "PowerLaw",
    "ScalingFitError",
    "fit_isoflop",
    "fit_parametric",
    "group_by_budget",
]
