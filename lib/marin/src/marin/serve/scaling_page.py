"""The scaling page: a sweep's finished runs, the laws fitted to them, and the size to train next.

What it shows is :func:`marin.scaling.analysis.analyse` of the prefix, the analysis ``marin scaling``
prints, so the page and the command agree number for number. Two charts, inline SVG drawn here as
:mod:`marin.serve.charts` draws the training curves, both with log x:

* loss against training FLOPs, a colour per model size, with the compute-optimal frontier: the
  parametric law's loss at each compute's best split, or else the IsoFLOP vertices joined;
* loss against parameters, a colour per budget, with each budget's IsoFLOP parabola over the
  sizes it tried and its minimum marked. On the first chart a budget's runs stand in one column
  (they share a compute), so its parabola can only be read here.

Each run is a circle linked to its step page (``data-run`` names the step); each line is a
``<polyline>`` whose ``data-points`` counts its points, so a test can read what was drawn. Under the
charts, the fitted values with their bootstrap intervals, the compute-optimal size and tokens at
the sweep's largest budget and ten and a hundred times it, and every run used or not used (with
why). A fit that cannot be made is shown as its reason, beside the other. As in ``marin scaling``,
a value the runs do not determine is marked "not identified" (``class="unidentified"``), an optimum
resting on one is given as that reason and nothing else (no frontier is drawn from it), and an
optimum beyond the largest budget fitted says so with its interval's width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from marin.scaling.analysis import ScalingAnalysis
from marin.scaling.fits import Estimate, IsoFlopCurve, Optimum, group_by_budget
from marin.scaling.points import ScalingRun
from marin.serve.charts import BOTTOM, COLOURS, HEIGHT, LEFT, RIGHT, TOP, WIDTH, tick_label, log_ticks, ticks
from marin.serve.pages import layout, link
from marin.serve.paths import relative_to

CURVE_POINTS = 48  # enough that a parabola or the frontier reads as smooth at the chart's width
SWEEP_COMMAND = "marin run experiments/tutorials/isoflop_sweep.py"
FRONTIER_COLOUR = "#222"

STYLE = """
.scaling-error{white-space:pre-wrap;border:1px solid #c62828;background:#fdecea;padding:8px;font-size:13px;max-width:100ch}
table.fit td.num{font-family:ui-monospace,monospace;font-size:12px;text-align:right}
.legend i.line{height:2px;vertical-align:middle}.legend i.dot{border-radius:50%}
td.unidentified,span.unidentified{color:#b26a00}td.unidentified{font-family:system-ui,sans-serif}
"""


# -- numbers as text ----------------------------------------------------------------------------


def _number(value: float) -> str:
    """Three significant figures; large and small values as ``2.5e16`` (no ``+``, no padded exponent)."""
    text = f"{value:.3g}"
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


def _interval(estimate: Estimate) -> str:
    if estimate.low == estimate.high:
        return _number(estimate.value)
    return f"{_number(estimate.value)} [{_number(estimate.low)}, {_number(estimate.high)}]"


def _size_interval(estimate: Estimate) -> str:
    if estimate.low == estimate.high:
        return _size_label(estimate.value)
    return f"{_size_label(estimate.value)} [{_size_label(estimate.low)}, {_size_label(estimate.high)}]"


def _size_label(value: float) -> str:
    """Parameters as one reads them in a model's name: 20M, 1.3B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return _number(value)


# -- one chart ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Frame:
    """A plot with log10 x and linear y: where a value lands, and the axes drawn around it."""

    x_lo: float  # log10 units
    x_hi: float
    y_lo: float
    y_hi: float

    @property
    def plot_w(self) -> int:
        return WIDTH - LEFT - RIGHT

    @property
    def plot_h(self) -> int:
        return HEIGHT - TOP - BOTTOM

    def sx(self, x: float) -> float:
        return LEFT + (math.log10(x) - self.x_lo) / (self.x_hi - self.x_lo) * self.plot_w

    def sy(self, y: float) -> float:
        return TOP + (1 - (y - self.y_lo) / (self.y_hi - self.y_lo)) * self.plot_h

    @classmethod
    def around(cls, xs: Sequence[float], ys: Sequence[float]) -> _Frame:
        x_lo, x_hi = math.log10(min(xs)), math.log10(max(xs))
        pad = (x_hi - x_lo) * 0.05 or 0.5  # one x (a single run): half a decade either side
        y_lo, y_hi = min(ys), max(ys)
        margin = (y_hi - y_lo) * 0.06 or (abs(y_lo) * 0.05 or 1.0)
        return cls(x_lo - pad, x_hi + pad, y_lo - margin, y_hi + margin)

    def axes(self, x_title: str, y_title: str, x_label: Callable[[float], str]) -> str:
        parts = [f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{self.plot_w}" height="{self.plot_h}" '
                 f'fill="#fff" stroke="#ccc"/>']
        y_ticks = ticks(self.y_lo, self.y_hi)
        y_spacing = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else None
        for tick in y_ticks:
            y = self.sy(tick)
            parts.append(f'<line x1="{LEFT}" x2="{LEFT + self.plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                         f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{tick_label(tick, y_spacing)}</text>')
        bottom = TOP + self.plot_h
        for tick in _decade_ticks(self.x_lo, self.x_hi):
            x = self.sx(10**tick)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}" stroke="#f2f2f2"/>'
                         f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}" stroke="#999"/>'
                         f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle" class="tick">{escape(x_label(10**tick))}</text>')
        parts.append(f'<text class="axis-title" x="{LEFT + self.plot_w / 2}" y="{HEIGHT - 6}" '
                     f'text-anchor="middle">{escape(x_title)} (log)</text>')
        parts.append(f'<text class="axis-title" transform="translate(14 {TOP + self.plot_h / 2}) rotate(-90)" '
                     f'text-anchor="middle">{escape(y_title)}</text>')
        return "".join(parts)

    def polyline(self, points: Sequence[tuple[float, float]], colour: str, cls: str, title: str, *,
                 dashed: bool = False, **data: str) -> str:
        """A line through ``points`` (data units); those a fit made non-finite or non-positive are left out."""
        kept = [(x, y) for x, y in points if x > 0 and math.isfinite(x) and math.isfinite(y)]
        if not kept:
            return ""
        coords = " ".join(f"{self.sx(x):.1f},{self.sy(y):.1f}" for x, y in kept)
        attrs = "".join(f' data-{key}="{escape(value)}"' for key, value in data.items())
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        return (f'<polyline class="{cls}" data-points="{len(kept)}"{attrs} fill="none" stroke="{colour}" '
                f'stroke-width="1.6"{dash} points="{coords}"><title>{escape(title)}</title></polyline>')


def _decade_ticks(lo: float, hi: float) -> list[float]:
    """Log-axis ticks at 1, 2, 5 times powers of ten; only the powers of ten when those would crowd."""
    placed = log_ticks(lo, hi)
    if len(placed) > 9:
        decades = [t for t in placed if abs(t - round(t)) < 1e-9]
        if len(decades) >= 2:
            return decades
    return placed


def _run_title(run: ScalingRun) -> str:
    return (f"{run.name}\nN = {_size_label(run.params)} parameters\nD = {_number(run.tokens)} tokens\n"
            f"C = {_number(run.flops)} FLOPs\nloss = {run.loss:.4f}")


def _run_circle(run: ScalingRun, x: float, colour: str, frame: _Frame, prefix: str) -> str:
    circle = (f'<circle class="run" data-run="{escape(run.name)}" cx="{frame.sx(x):.1f}" cy="{frame.sy(run.loss):.1f}" '
              f'r="4" fill="{colour}" stroke="#fff" stroke-width="0.8"><title>{escape(_run_title(run))}</title></circle>')
    path = relative_to(prefix, run.path) if run.path else None
    return f'<a href="{escape(link("/step", path=path))}">{circle}</a>' if path else circle


def _figure(chart_id: str, title: str, frame: _Frame, x_title: str, x_label: Callable[[float], str],
            marks: list[str], legend: list[tuple[str, str, bool]]) -> str:
    """A chart's figure; ``legend`` holds ``(label, colour, is_line)``."""
    keys = "".join(f'<span class="key"><i class="{"line" if line else "dot"}" style="background:{colour}"></i>'
                   f"{escape(label)}</span>" for label, colour, line in legend)
    return (f'<figure class="chart" id="{chart_id}" data-title="{escape(title)}"><figcaption>{escape(title)}</figcaption>'
            f'<svg class="chart scaling" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="xMidYMid meet" role="img" '
            f'aria-label="{escape(title)}">{frame.axes(x_title, "validation loss", x_label)}{"".join(marks)}</svg>'
            f'<div class="legend">{keys}</div></figure>')


def _vertex(curve: IsoFlopCurve, colour: str, frame: _Frame) -> str:
    """A budget's best size, as a diamond on its parabola."""
    x, y = frame.sx(curve.params_opt), frame.sy(curve.loss_opt)
    return (f'<path class="vertex" data-budget="{curve.budget!r}" d="M{x:.1f},{y - 7:.1f} L{x + 7:.1f},{y:.1f} '
            f'L{x:.1f},{y + 7:.1f} L{x - 7:.1f},{y:.1f} Z" fill="none" stroke="{colour}" stroke-width="2">'
            f"<title>best size at {_number(curve.budget)} FLOPs: N = {_size_label(curve.params_opt)}, "
            f"D = {_number(curve.tokens_opt)}, loss {curve.loss_opt:.4f}</title></path>")


def _frontier(analysis: ScalingAnalysis) -> tuple[list[tuple[float, float]], str]:
    """The loss of the compute-optimal model across the sweep's compute, and which fit gave it."""
    runs = analysis.collected.runs
    if analysis.parametric is not None and not analysis.parametric.unidentified(("A", "B", "alpha", "beta")):
        fit = analysis.parametric
        low, high = min(run.flops for run in runs), max(run.flops for run in runs)
        if high < 2 * low:  # one budget: the law still holds either side of it, and a line there reads as one
            low, high = low / 3, high * 3
        computes = np.geomspace(low, high, CURVE_POINTS)
        return [(float(c), float(fit.loss(*fit.optimal(float(c))))) for c in computes], "parametric fit"
    if analysis.isoflop is not None:
        return [(curve.budget, curve.loss_opt) for curve in analysis.isoflop.curves], "IsoFLOP minima"
    return [], ""


def loss_flops_chart(analysis: ScalingAnalysis, prefix: str) -> str:
    """Loss against compute, a colour per model size, and the compute-optimal frontier."""
    runs = analysis.collected.runs
    sizes = sorted({run.params for run in runs})
    colour = {size: COLOURS[i % len(COLOURS)] for i, size in enumerate(sizes)}
    frontier, source = _frontier(analysis)
    frontier = [(c, loss) for c, loss in frontier if math.isfinite(loss)]
    frame = _Frame.around([run.flops for run in runs] + [c for c, _ in frontier],
                          [run.loss for run in runs] + [loss for _, loss in frontier])
    marks = []
    if frontier:
        marks.append(frame.polyline(frontier, FRONTIER_COLOUR, "frontier", f"compute-optimal loss ({source})",
                                    dashed=True, source=source))
    marks += [_run_circle(run, run.flops, colour[run.params], frame, prefix) for run in runs]
    legend = [(f"N = {_size_label(size)}", colour[size], False) for size in sizes]
    if frontier:
        legend.append((f"compute-optimal loss ({source})", FRONTIER_COLOUR, True))
    return _figure("loss-flops", "loss against training compute", frame, "training FLOPs C", _number, marks, legend)


def loss_params_chart(analysis: ScalingAnalysis, prefix: str) -> str:
    """Loss against size, a colour per budget, with each budget's IsoFLOP parabola and its minimum."""
    runs = analysis.collected.runs
    groups = group_by_budget(runs)
    curves = {curve.budget: curve for curve in analysis.isoflop.curves} if analysis.isoflop else {}
    colour = {budget: COLOURS[i % len(COLOURS)] for i, budget in enumerate(sorted(set(groups) | set(curves)))}
    lines: dict[float, list[tuple[float, float]]] = {}
    for budget, curve in curves.items():
        sizes = [run.params for run in curve.runs]
        lines[budget] = [(float(n), curve.loss_at(float(n))) for n in np.geomspace(min(sizes), max(sizes), CURVE_POINTS)]
    predicted: dict[float, list[tuple[float, float]]] = {}
    if analysis.parametric is not None:  # the parametric law along the same budget, to compare the two fits
        fit, k = analysis.parametric, analysis.parametric.flops_per_param_token
        for budget, members in groups.items():
            sizes = np.geomspace(min(r.params for r in members), max(r.params for r in members), CURVE_POINTS)
            predicted[budget] = [(float(n), float(fit.loss(n, budget / (k * n)))) for n in sizes]
    drawn = [p for points in (*lines.values(), *predicted.values()) for p in points if math.isfinite(p[1])]
    # A vertex is marked within a decade of the sizes its budget tried; one further out (a nearly flat
    # parabola) would squeeze every run into a corner, and the table still gives its value.
    marked = {budget: curve for budget, curve in curves.items() if math.isfinite(curve.loss_opt)
              and min(r.params for r in curve.runs) / 10 <= curve.params_opt <= max(r.params for r in curve.runs) * 10}
    vertices = [(curve.params_opt, curve.loss_opt) for curve in marked.values()]
    frame = _Frame.around([run.params for run in runs] + [n for n, _ in drawn + vertices],
                          [run.loss for run in runs] + [loss for _, loss in drawn + vertices])
    marks = []
    for budget, points in predicted.items():
        marks.append(frame.polyline(points, colour[budget], "parametric",
                                    f"parametric fit at {_number(budget)} FLOPs", dashed=True, budget=repr(budget)))
    for budget, points in lines.items():
        curve = curves[budget]
        marks.append(frame.polyline(points, colour[budget], "parabola", f"IsoFLOP parabola at {_number(budget)} FLOPs",
                                    budget=repr(budget)))
        if budget in marked:
            marks.append(_vertex(curve, colour[budget], frame))
    for budget, members in groups.items():
        marks += [_run_circle(run, run.params, colour[budget], frame, prefix) for run in members]
    legend = [(f"C = {_number(budget)} FLOPs", colour[budget], False) for budget in colour]
    notes = ["◇ best size per budget"] if curves else []
    if predicted:
        notes.append("dashed: parametric fit")
    title = "IsoFLOP curves: loss against parameters" + (f" ({'; '.join(notes)})" if notes else "")
    return _figure("loss-params", title, frame, "parameters N", _size_label, marks, legend)


# -- the tables ---------------------------------------------------------------------------------


def _estimate_cell(cell_id: str, estimate: Estimate) -> str:
    cell = (f'<td class="num" id="{cell_id}" data-value="{estimate.value!r}" data-low="{estimate.low!r}" '
            f'data-high="{estimate.high!r}">{escape(_interval(estimate))}</td>')
    if estimate.unidentified:
        cell += f'<td class="unidentified" data-for="{cell_id}">not identified: {escape(estimate.unidentified)}</td>'
    return cell


def _fit_error(fit_id: str, message: str) -> str:
    return f'<div class="scaling-error" id="{fit_id}-error">not fitted: {escape(message)}</div>'


def _isoflop_section(analysis: ScalingAnalysis) -> str:
    head = "<h3>IsoFLOP fit</h3><p class=\"muted\">a parabola in log size per budget; its minima as power laws of compute</p>"
    fit = analysis.isoflop
    if fit is None:
        return head + _fit_error("isoflop", analysis.isoflop_error or "no runs")
    rows = "".join(
        f'<tr data-budget="{curve.budget!r}"><td class="num">{_number(curve.budget)}</td><td class="num">{len(curve.runs)}</td>'
        f'<td class="num">{_size_label(curve.params_opt)}</td><td class="num">{_number(curve.tokens_opt)}</td>'
        f'<td class="num">{_number(curve.tokens_opt / curve.params_opt)}</td><td class="num">{curve.loss_opt:.4f}</td>'
        + ('<td class="unidentified">outside the sizes tried (extrapolated)</td>' if curve.extrapolated else "<td></td>")
        + "</tr>"
        for curve in fit.curves)
    laws = "".join(
        f'<tr><th>{name}(C)</th><td class="num">{_number(law.coefficient.value)} · C<sup>{_number(law.exponent.value)}</sup></td>'
        + _estimate_cell(f"isoflop-{key}-exponent", law.exponent) + "</tr>"
        for name, key, law in (("N_opt", "params", fit.params_opt), ("D_opt", "tokens", fit.tokens_opt)))
    return (head + '<table class="fit" id="isoflop-curves"><thead><tr><th>budget C</th><th>runs</th><th>N_opt</th>'
            f"<th>D_opt</th><th>D/N</th><th>loss_opt</th><th></th></tr></thead><tbody>{rows}</tbody></table>"
            '<p></p><table class="fit" id="isoflop-laws"><thead><tr><th>law</th><th>form</th>'
            f"<th>exponent [bootstrap interval]</th><th></th></tr></thead><tbody>{laws}</tbody></table>")


def _parametric_section(analysis: ScalingAnalysis) -> str:
    head = ("<h3>Parametric fit</h3><p class=\"muted\">L(N, D) = E + A / N<sup>α</sup> + B / D<sup>β</sup>, "
            "a Huber loss on log L as in Chinchilla</p>")
    fit = analysis.parametric
    if fit is None:
        return head + _fit_error("parametric", analysis.parametric_error or "no runs")
    rows = "".join(f"<tr><th>{label}</th>{_estimate_cell(f'parametric-{name}', getattr(fit, name))}</tr>"
                   for name, label in (("E", "E"), ("A", "A"), ("B", "B"), ("alpha", "α"), ("beta", "β")))
    rows += (f"<tr><th>N_opt ∝ C<sup>a</sup>, a = β/(α+β)</th>{_estimate_cell('parametric-params-exponent', fit.params_exponent)}</tr>"
             f"<tr><th>D_opt ∝ C<sup>b</sup>, b = α/(α+β)</th>{_estimate_cell('parametric-tokens-exponent', fit.tokens_exponent)}</tr>")
    return (head + f'<table class="fit" id="parametric"><thead><tr><th>value</th><th>fit [{fit.confidence:.0%} bootstrap interval]</th><th></th>'
            f"</tr></thead><tbody>{rows}</tbody></table>"
            f'<p class="muted">C = {_number(fit.flops_per_param_token)} N D (the runs\' own FLOPs per parameter per token); '
            f"{len(fit.refits)} bootstrap refits</p>")


def _optimum_cells(optimum: Optimum) -> str:
    if optimum.unidentified:
        return f'<td class="unidentified" colspan="3">not identified: {escape(optimum.unidentified)}</td>'
    size, data = optimum.params, optimum.tokens
    note = ""
    if optimum.extrapolated:
        spread = size.high / size.low if size.low > 0 else math.inf
        width = f", its interval a factor of {_number(spread)} wide" if size.low != size.high else ""
        note = (f'<br><span class="unidentified extrapolated">{_number(optimum.beyond)}× beyond the largest budget '
                f"fitted{width}</span>")
    return (f'<td class="num">{escape(_size_interval(size))}{note}</td><td class="num">{escape(_interval(data))}</td>'
            f'<td class="num">{_number(data.value / size.value)}</td>')


def _optimal_section(analysis: ScalingAnalysis, budgets: Sequence[float]) -> str:
    fits = [name for name, fit in (("isoflop", analysis.isoflop), ("parametric", analysis.parametric)) if fit is not None]
    if not fits or not budgets:
        return ""
    head = "".join(f'<th colspan="3">{name}</th>' for name in fits)
    sub = "<th>N</th><th>D</th><th>D/N</th>" * len(fits)
    rows = []
    for row in analysis.optimal_at(budgets):
        cells = "".join(_optimum_cells(row[name]) for name in fits)
        rows.append(f'<tr data-flops="{row["flops"]!r}"><td class="num">{_number(row["flops"])}</td>{cells}</tr>')
    return ("<h3>Compute-optimal allocation</h3><p class=\"muted\">at the sweep's largest budget, and ten and a hundred "
            "times it, with bootstrap intervals; beyond the largest budget an optimum is extrapolated</p>"
            f'<table class="fit" id="optimal"><thead><tr><th rowspan="2">C (FLOPs)</th>{head}</tr><tr>{sub}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _step_link(name: str, path: str | None, prefix: str) -> str:
    relative = relative_to(prefix, path) if path else None
    if relative is None:
        return escape(name)
    return f'<a href="{escape(link("/step", path=relative))}">{escape(name)}</a>'


def _runs_section(analysis: ScalingAnalysis, prefix: str) -> str:
    collected = analysis.collected
    parts = []
    if collected.runs:
        rows = "".join(
            f'<tr data-run="{escape(run.name)}"><td>{_step_link(run.name, run.path, prefix)}</td>'
            f'<td class="num">{_size_label(run.params)}</td><td class="num">{_number(run.tokens)}</td>'
            f'<td class="num">{_number(run.flops)}</td><td class="num">{"-" if run.budget is None else _number(run.budget)}</td>'
            f'<td class="num">{run.loss:.4f}</td></tr>'
            for run in sorted(collected.runs, key=lambda r: (r.budget or r.flops, r.params, r.name)))
        parts.append(f"<h3>Runs used ({len(collected.runs)})</h3>"
                     '<table class="fit" id="runs-used"><thead><tr><th>step</th><th>params N</th><th>tokens D</th>'
                     f"<th>FLOPs C</th><th>budget</th><th>loss</th></tr></thead><tbody>{rows}</tbody></table>")
    if collected.skipped:
        rows = "".join(f'<tr data-skipped="{escape(skip.name)}"><td>{_step_link(skip.name, skip.path, prefix)}</td>'
                       f"<td>{escape(skip.reason)}</td></tr>" for skip in collected.skipped)
        parts.append(f"<h3>Not used ({len(collected.skipped)})</h3>"
                     f'<table id="runs-skipped"><thead><tr><th>step</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>')
    return "".join(parts)


def _controls(analysis: ScalingAnalysis, validation: str | None) -> str:
    sets = list(analysis.collected.validation_sets)
    if validation and validation not in sets:
        sets.append(validation)
    options = '<option value="">each run\'s first</option>' + "".join(
        f'<option value="{escape(name)}"{" selected" if name == validation else ""}>{escape(name)}</option>' for name in sets)
    return ('<form method="get" action="/scaling" class="controls" id="scaling-controls">'
            f'steps <input name="steps" size="36" placeholder="a glob, e.g. sweeps/isoflop-tinystories/*" '
            f'value="{escape(analysis.steps or "")}"> · validation loss of <select name="validation">{options}</select> '
            f'<button>fit</button> <a href="{escape(link("/api/scaling", steps=analysis.steps, validation=validation))}">'
            "as JSON</a></form>")


def _empty_state(analysis: ScalingAnalysis) -> str:
    scope = (f" whose step name matches <code>{escape(analysis.steps)}</code>" if analysis.steps else "")
    return (f'<div id="empty-state"><p>No finished training runs under this prefix{scope}, so there is nothing to fit yet.</p>'
            "<p>A scaling law needs a sweep: models of several sizes, each trained at a few compute budgets. "
            "The tutorial declares one small enough for a laptop:</p>"
            f"<pre>{escape(SWEEP_COMMAND)}</pre>"
            "<p>then come back to this page (or run <code>marin scaling</code>) to see the fits.</p></div>")


def scaling_page(analysis: ScalingAnalysis, budgets: Sequence[float], prefix: str, validation: str | None = None) -> str:
    collected = analysis.collected
    parts = [f"<style>{STYLE}</style>", _controls(analysis, validation)]
    if not collected.runs:
        parts.append(_empty_state(analysis))
        parts.append(_runs_section(analysis, prefix))  # runs that are there but could not be used, and why
        return layout("Scaling", "".join(parts), prefix)
    scope = f" whose step name matches <code>{escape(analysis.steps)}</code>" if analysis.steps else ""
    loss = f"validation loss of <code>{escape(validation)}</code>" if validation else "each run's first validation loss"
    parts.append(f'<p id="summary">{len(collected.runs)} finished training run(s){scope}; fitted to {loss}.</p>')
    parts += [f'<p class="muted note">note: {escape(note)}</p>' for note in collected.notes]
    parts.append(f'<div class="charts">{loss_flops_chart(analysis, prefix)}{loss_params_chart(analysis, prefix)}</div>')
    parts += [_isoflop_section(analysis), _parametric_section(analysis), _optimal_section(analysis, budgets),
              _runs_section(analysis, prefix)]
    return layout("Scaling", "".join(parts), prefix)
