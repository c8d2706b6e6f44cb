"""The scaling-law figure: IsoFLOP curves on the left, the compute-optimal N and D on the right.

Left, each run's loss against its size, one colour per budget, with that budget's parabola over
the sizes tried and its vertex marked (and, given a parametric fit, the loss it predicts along the
same budget, dashed). Right, the vertices' N_opt and D_opt against compute with the power laws
through them, and the parametric fit's optimum where the runs determine it (a law whose exponents
are not identified is drawn with "not identified" in its legend, a parametric optimum resting on
values the runs do not determine is not drawn at all).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from rigging import filesystem as fsx

from marin.scaling.fits import IsoFlopFit, ParametricFit, group_by_budget
from marin.scaling.points import ScalingRun


def plot_scaling(runs: Sequence[ScalingRun], isoflop: IsoFlopFit | None, parametric: ParametricFit | None,
                 path: str, *, title: str) -> str:
    """Write the figure as a PNG at ``path``, a local path or URL (Agg backend: no display needed); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=120)
    groups = group_by_budget(runs) if runs else {}
    fitted = {curve.budget for curve in isoflop.curves} if isoflop else set()
    colour = _budget_colours(sorted(set(groups) | fitted), plt)

    _plot_isoflop_curves(left, groups, isoflop, parametric, colour)
    _plot_optimal_allocation(right, runs, isoflop, parametric)

    figure.suptitle(title)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    plt.close(figure)
    fsx.atomic_write(path, png.getvalue())
    return path


def _budget_colours(budgets: list[float], plt):
    """A colour per budget from one colour map ordered by log budget, so scatter and curve always match."""
    cmap = plt.get_cmap("viridis")
    if len(budgets) <= 1:
        return lambda budget: cmap(0.0)
    low, high = np.log10(budgets[0]), np.log10(budgets[-1])
    return lambda budget: cmap(0.9 * (np.log10(budget) - low) / (high - low))


def _plot_isoflop_curves(axes, groups, isoflop, parametric, colour) -> None:
    curves = {curve.budget: curve for curve in isoflop.curves} if isoflop else {}
    for budget, members in groups.items():
        sizes = [run.params for run in members]
        axes.scatter(sizes, [run.loss for run in members], color=colour(budget), s=22, zorder=3,
                     label=f"{budget:.2g} FLOPs")
        if parametric is not None:
            grid = np.geomspace(min(sizes), max(sizes), 100)
            k = parametric.flops_per_param_token
            axes.plot(grid, parametric.loss(grid, budget / (k * grid)), color=colour(budget), linewidth=1.0,
                      linestyle="--", alpha=0.7)
    for budget, curve in curves.items():
        grid = np.geomspace(min(run.params for run in curve.runs), max(run.params for run in curve.runs), 100)
        axes.plot(grid, [curve.loss_at(size) for size in grid], color=colour(budget), linewidth=1.4)
        axes.scatter([curve.params_opt], [curve.loss_opt], marker="*", s=140, color=colour(budget),
                     edgecolors="black", linewidths=0.6, zorder=4)
    axes.set_xscale("log")
    # A sweep spans a decade or two: labelled minor ticks (2x10^4, 3x10^4, ...) would run into each other.
    from matplotlib.ticker import NullFormatter

    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("parameters N")
    axes.set_ylabel("loss (nats per token)")
    notes = (["★ best size"] if curves else []) + (["dashed: parametric fit"] if parametric is not None else [])
    axes.set_title("IsoFLOP curves" + (f" ({'; '.join(notes)})" if notes else ""))
    axes.grid(True, which="both", alpha=0.3)
    if groups:
        axes.legend(loc="upper right", fontsize="small", title="budget")
    else:
        axes.text(0.5, 0.5, "no runs", ha="center", va="center", transform=axes.transAxes)


def _plot_optimal_allocation(axes, runs, isoflop, parametric) -> None:
    computes = [run.flops for run in runs] + ([curve.budget for curve in isoflop.curves] if isoflop else [])
    if not computes or (isoflop is None and parametric is None):
        axes.text(0.5, 0.5, "no fit", ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
        return
    # A decade beyond the sweep on each side: far enough to read off a next run's size.
    grid = np.geomspace(min(computes) / 10.0, max(computes) * 10.0, 100)
    if isoflop is not None:
        budgets = [curve.budget for curve in isoflop.curves]
        for law, values, marker, colour, name in (
            (isoflop.params_opt, [curve.params_opt for curve in isoflop.curves], "o", "tab:blue", "N_opt"),
            (isoflop.tokens_opt, [curve.tokens_opt for curve in isoflop.curves], "s", "tab:orange", "D_opt"),
        ):
            axes.scatter(budgets, values, marker=marker, color=colour, zorder=3)
            exponent = law.exponent
            verdict = " not identified" if exponent.unidentified else ""
            axes.plot(grid, [law(compute) for compute in grid], color=colour, linewidth=1.4,
                      label=f"{name} ∝ C^{exponent.value:.3f} [{exponent.low:.3f}, {exponent.high:.3f}] (IsoFLOP{verdict})")
    if parametric is not None and not parametric.unidentified(("A", "B", "alpha", "beta")):
        optimum = np.array([parametric.optimal(compute) for compute in grid])
        for column, colour, name, exponent in ((0, "tab:blue", "N_opt", parametric.params_exponent),
                                               (1, "tab:orange", "D_opt", parametric.tokens_exponent)):
            axes.plot(grid, optimum[:, column], color=colour, linestyle="--", linewidth=1.2,
                      label=f"{name} ∝ C^{exponent.value:.3f} [{exponent.low:.3f}, {exponent.high:.3f}] (parametric)")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("training compute C (FLOPs)")
    axes.set_ylabel("parameters N_opt / tokens D_opt")
    axes.set_title("compute-optimal allocation")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")
