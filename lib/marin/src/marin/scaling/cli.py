"""``marin scaling [PREFIX] [--steps GLOB] [--json] [--png FILE] [--budget FLOPS ...]``: fit a sweep's scaling laws.

Reads the finished ``train_lm`` runs under PREFIX (default: the discovered prefix) whose step
names match GLOB (``sweeps/isoflop-nano/*``), fits the IsoFLOP law (a parabola per budget, its
minima as power laws of compute) and the parametric law ``L(N, D) = E + A/N^alpha + B/D^beta``,
each with bootstrap intervals, and prints the fitted values, the compute-optimal size and tokens
at each ``--budget`` (default: the sweep's own largest budget, and ten and a hundred times it),
and the runs used. A value the runs do not determine (on a bound of the fit, or an interval over
orders of magnitude) is marked "not identified", and no optimum resting on it is printed; an
optimum beyond the largest budget fitted says how far beyond and how wide its interval is. Runs
that differ in more than size and budget (optimizer, data, initial weights, validation set) are
not fitted together: the largest group of alike runs is, the others are listed with what differs
(``--mixed`` fits them all). ``--json`` prints the same as one JSON object; ``--png`` also draws the plot.
Exit status 1 when neither law can be fitted (each reason is printed), 2 for a usage error (a
budget that is not a finite positive number, more than 10,000 bootstrap refits).
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_OK = 0
EXIT_NO_FIT = 1
EXIT_USAGE = 2
# Each refit of the parametric law is a small optimisation (tens of milliseconds): ten thousand is
# minutes, and narrows a 95% interval no further than a few thousand do.
MAX_BOOTSTRAP = 10_000


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("scaling", help="fit scaling laws (IsoFLOP and parametric) to a sweep's finished runs",
                                   description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("prefix", nargs="?", metavar="PREFIX", help="folder or fsspec URL (default: the discovered prefix)")
    parser.add_argument("--steps", metavar="GLOB", help="only runs whose step name matches GLOB, e.g. 'sweeps/isoflop/*'")
    parser.add_argument("--validation", metavar="SET", help="the validation set whose loss is fitted (default: each run's first)")
    parser.add_argument("--budget", type=float, action="append", default=[], metavar="FLOPS",
                        help="a compute budget to give the optimal size and tokens for (repeatable)")
    parser.add_argument("--bootstrap", type=int, default=200, metavar="N", help="bootstrap refits for the intervals (default 200)")
    parser.add_argument("--mixed", action="store_true",
                        help="fit runs that differ in more than size and budget together (refused by default)")
    parser.add_argument("--png", metavar="FILE", help="also write the plot there (a path or URL)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    parser.set_defaults(handler=scaling_command)


def scaling_command(args: argparse.Namespace) -> int:
    from rigging import filesystem as fsx
    from rigging.config.discovery import discover_config

    from marin.scaling.analysis import analyse

    prefix = discover_config(prefix=args.prefix).prefix
    if fsx.is_local(prefix) and not fsx.exists(prefix):
        print(f"marin scaling: there is no folder {prefix}; check PREFIX (or MARIN_PREFIX).", file=sys.stderr)
        return EXIT_USAGE
    problem = _usage_problem(args)
    if problem:
        print(f"marin scaling: {problem}", file=sys.stderr)
        return EXIT_USAGE
    analysis = analyse(prefix, steps=args.steps, validation=args.validation, bootstrap=args.bootstrap,
                       mixed=args.mixed)
    budgets = args.budget or analysis.default_budgets()
    if args.png and (analysis.isoflop is not None or analysis.parametric is not None):
        from marin.scaling.plot import plot_scaling

        plot_scaling(analysis.collected.runs, analysis.isoflop, analysis.parametric, args.png,
                     title=f"Scaling: {args.steps or prefix}")
    if args.json:
        print(json.dumps(analysis.to_json(budgets), indent=1))
    else:
        print(report_text(analysis, budgets, png=args.png))
    return EXIT_NO_FIT if analysis.isoflop is None and analysis.parametric is None else EXIT_OK


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the numbers given (``--budget nan`` and ``--budget 1e400`` parse as floats)."""
    import math

    bad = [budget for budget in args.budget if not (math.isfinite(budget) and budget > 0)]
    if bad:
        return f"every --budget must be a finite positive number of FLOPs, got {', '.join(map(str, bad))}."
    if not 0 <= args.bootstrap <= MAX_BOOTSTRAP:
        return f"--bootstrap must be between 0 and {MAX_BOOTSTRAP} refits, got {args.bootstrap}."
    return None


def _interval(estimate, digits: str = ".3g") -> str:
    text = format(estimate.value, digits)
    if estimate.low != estimate.high:
        text += f" [{estimate.low:{digits}}, {estimate.high:{digits}}]"
    return text + (f"   not identified: {estimate.unidentified}" if estimate.unidentified else "")


def _optimum_line(name: str, optimum) -> str:
    head = f"  C = {optimum.compute:.3g} FLOPs ({name:>10}): "
    if optimum.unidentified:
        return head + f"not identified ({optimum.unidentified}); no optimum given"
    size, data = optimum.params, optimum.tokens
    line = (head + f"N = {_bare(size)} parameters, D = {_bare(data)} tokens "
            f"({data.value / size.value:.3g} tokens per parameter)")
    if optimum.extrapolated:
        spread = max(size.high / size.low, data.high / data.low) if size.low > 0 and data.low > 0 else float("inf")
        width = f"; its interval spans a factor of {spread:.3g}" if size.low != size.high else "; no interval"
        line += (f"\n    extrapolated {optimum.beyond:.3g}x beyond the largest budget fitted "
                 f"({optimum.largest_budget:.3g} FLOPs){width}")
    return line


def _bare(estimate) -> str:
    """A value and its interval, without the verdict (an optimum that is printed is identified)."""
    if estimate.low == estimate.high:
        return f"{estimate.value:.3g}"
    return f"{estimate.value:.3g} [{estimate.low:.3g}, {estimate.high:.3g}]"


def report_text(analysis, budgets: list[float], *, png: str | None = None) -> str:
    """The report ``marin scaling`` prints."""
    collected = analysis.collected
    scope = f" (steps matching {analysis.steps})" if analysis.steps else ""
    lines = [f"Scaling fits of {len(collected.runs)} finished run(s) under {analysis.prefix}{scope}."]
    lines += [f"  note: {note}" for note in collected.notes]
    lines.append("")
    lines.append("IsoFLOP (a parabola in log size per budget; its minima as power laws of compute):")
    if analysis.isoflop is None:
        lines.append(f"  not fitted: {analysis.isoflop_error}")
    else:
        fit = analysis.isoflop
        lines.append(f"  {'budget':>10} {'runs':>5} {'N_opt':>10} {'D_opt':>10} {'loss_opt':>9}")
        for curve in fit.curves:
            outside = "  outside the sizes tried (extrapolated)" if curve.extrapolated else ""
            lines.append(f"  {curve.budget:>10.3g} {len(curve.runs):>5} {curve.params_opt:>10.3g} "
                         f"{curve.tokens_opt:>10.3g} {curve.loss_opt:>9.4f}{outside}")
        lines.append(f"  N_opt(C) = {fit.params_opt.coefficient.value:.3g} * C^{_interval(fit.params_opt.exponent)}")
        lines.append(f"  D_opt(C) = {fit.tokens_opt.coefficient.value:.3g} * C^{_interval(fit.tokens_opt.exponent)}")
    lines.append("")
    lines.append("Parametric L(N, D) = E + A / N^alpha + B / D^beta (Huber loss on log L, as in Chinchilla):")
    if analysis.parametric is None:
        lines.append(f"  not fitted: {analysis.parametric_error}")
    else:
        fit = analysis.parametric
        for name in ("E", "A", "B", "alpha", "beta"):
            lines.append(f"  {name:<6} = {_interval(getattr(fit, name))}")
        exponents = (f"  N_opt ~ C^{_bare(fit.params_exponent)}, D_opt ~ C^{_bare(fit.tokens_exponent)} "
                     f"(C = {fit.flops_per_param_token:.3g} N D, the runs' own FLOPs per parameter per token)")
        if fit.params_exponent.unidentified:
            exponents = f"  N_opt ~ C^a, D_opt ~ C^b: not identified ({fit.params_exponent.unidentified})"
        lines.append(exponents)
    rows = analysis.optimal_at(budgets)
    if rows and (analysis.isoflop is not None or analysis.parametric is not None):
        confidence = (analysis.parametric or analysis.isoflop).confidence
        lines.append("")
        lines.append(f"Compute-optimal allocation ({confidence:.0%} bootstrap intervals):")
        for row in rows:
            lines += [_optimum_line(name, row[name]) for name in ("isoflop", "parametric") if name in row]
    lines.append("")
    lines.append("Runs used:")
    lines.append(f"  {'params':>10} {'tokens':>10} {'FLOPs':>10} {'budget':>10} {'loss':>8}  step")
    for run in sorted(collected.runs, key=lambda r: (r.budget or r.flops, r.params)):
        budget = f"{run.budget:.3g}" if run.budget else "-"
        lines.append(f"  {run.params:>10.3g} {run.tokens:>10.3g} {run.flops:>10.3g} {budget:>10} {run.loss:>8.4f}  {run.name}")
    for skip in collected.skipped:
        lines.append(f"  not used: {skip.name}: {skip.reason}")
    if png:
        lines.append("")
        lines.append(f"Plot written to {png}" if analysis.isoflop is not None or analysis.parametric is not None
                     else "No plot written: nothing was fitted.")
    return "\n".join(lines)
