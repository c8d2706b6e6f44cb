"""Line charts as inline SVG, drawn on the server, with a small script for what needs the pointer.

Why not a charting library: the curves of one run are a few thousand points, which SVG drawn here
shows exactly and without any script; the page needs no file beyond itself (no CDN, no vendored
bundle to keep current), and tests can read what was drawn from the page source. What needs the
pointer (the readout under the cursor, smoothing while the slider moves, drag-to-zoom) is
:data:`CHART_SCRIPT`, which works from numbers the server wrote into the SVG: each series'
``data-values`` (its ``[x, y]`` points) and the plot's scale (``data-x-lo`` ...). Log y, x by
tokens and the zoomed range are redrawn by the server from the page's query.

Each series is one ``<polyline>`` whose ``data-points`` attribute counts its points, so a test (or
a curious reader of the page source) can check what was drawn.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from html import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
WIDTH, HEIGHT = 640, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 10, 44


@dataclass(frozen=True)
class Axes:
    """How a chart is drawn: its axis titles, log or linear y, the x range shown (``None``: all)."""

    x_title: str = "step"
    y_title: str = ""
    log_y: bool = False
    x_range: tuple[float, float] | None = None


def smooth(values: list[float], weight: float) -> list[float]:
    """Exponential moving average with the start-up bias removed (so the first point is itself).

    ``weight`` 0 leaves the values alone; 0.99 averages over about the last hundred. The page's
    script computes the same, point for point, while the slider moves.
    """
    if weight <= 0:
        return list(values)
    out, average = [], 0.0
    for index, value in enumerate(values):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight ** (index + 1)))
    return out


def _nice_step(span: float, count: int) -> float:
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))


def ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    if hi <= lo:
        return [lo]
    step = _nice_step(hi - lo, count)
    if integer:
        step = max(1.0, step)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def tick_label(value: float, step: float | None = None) -> str:
    """A tick label with as many decimals as the tick spacing needs, so neighbours never read alike."""
    if value == 0:
        return "0"
    size = abs(value)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if size >= scale * 10 and (step is None or step >= scale / 100):
            decimals = 0 if step is None else max(0, -math.floor(math.log10(step / scale) + 1e-9))
            return f"{value / scale:.{min(decimals, 3)}f}{unit}"
    if size < 1e-3:
        return f"{value:.1e}"
    if step is None:
        return f"{value:.4g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{min(decimals, 6)}f}"


def value_text(value: float) -> str:
    """A value as the readout shows it: four significant figures."""
    return f"{value:.4g}"


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks for a log axis given in log10 units: 1, 2, 5 times powers of ten inside the range."""
    candidates = [math.log10(m * 10.0**e) for e in range(math.floor(lo) - 1, math.ceil(hi) + 1) for m in (1, 2, 5)]
    inside = [t for t in candidates if lo - 1e-9 <= t <= hi + 1e-9]
    if len(inside) >= 2:
        return inside
    return [math.log10(v) for v in ticks(10**lo, 10**hi) if v > 0]  # a narrow range: linear ticks, placed on the log scale


def _in_range(points: list[tuple[float, float]], axes: Axes) -> list[tuple[float, float]]:
    kept = points
    if axes.x_range is not None:
        lo, hi = axes.x_range
        kept = [p for p in kept if lo <= p[0] <= hi]
    if axes.log_y:
        kept = [p for p in kept if p[1] > 0]
    return kept


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], axes: Axes = Axes(), *,
               smoothing: float = 0.0) -> str:
    """One chart: a line per series, axis titles, ticks whose labels differ, data for the page's script."""
    series = {name: _in_range(points, axes) for name, points in series.items()}
    series = {name: points for name, points in series.items() if points}
    head = f'<figure class="chart" data-title="{escape(title)}"><figcaption>{escape(title)}</figcaption>'
    if not series:
        why = "no positive values for a log axis" if axes.log_y else "no data" if axes.x_range is None else "no data in this range"
        return head + f'<p class="muted">{why}</p></figure>'
    points = [p for values in series.values() for p in values]
    transform = math.log10 if axes.log_y else (lambda y: y)
    xs, ys = [p[0] for p in points], [transform(p[1]) for p in points]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    integer_x = axes.x_title == "step"
    x_ticks = [x_lo] if x_hi == x_lo else ticks(x_lo, x_hi, integer=integer_x)
    if x_hi == x_lo:  # one step: the point in the middle, one tick under it
        x_lo, x_hi = x_lo - 1, x_hi + 1
    else:  # the first and last points (a final validation loss) stand off the plot's border
        x_margin = (x_hi - x_lo) * 0.02
        x_lo, x_hi = x_lo - x_margin, x_hi + x_margin
    if y_hi == y_lo:  # one value: a band around it whose ticks still read as different numbers
        pad = (abs(y_lo) * 0.05) or 1.0
        y_lo, y_hi = y_lo - pad, y_hi + pad
    else:
        margin = (y_hi - y_lo) * 0.04
        y_lo, y_hi = y_lo - margin, y_hi + margin
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return TOP + (1 - (transform(y) - y_lo) / (y_hi - y_lo)) * plot_h

    scale = {"x-lo": x_lo, "x-hi": x_hi, "y-lo": y_lo, "y-hi": y_hi, "left": LEFT, "top": TOP, "plot-w": plot_w,
             "plot-h": plot_h, "log": int(axes.log_y), "x-title": axes.x_title}
    data = " ".join(f'data-{key}="{escape(str(value))}"' for key, value in scale.items())
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="xMidYMid meet" role="img" '
             f'aria-label="{escape(title)}" {data}>']
    parts.append(f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#ccc"/>')
    y_ticks = log_ticks(y_lo, y_hi) if axes.log_y else ticks(y_lo, y_hi)
    y_spacing = (y_ticks[1] - y_ticks[0]) if len(y_ticks) > 1 else None
    for tick in y_ticks:
        value = 10**tick if axes.log_y else tick
        y = TOP + (1 - (tick - y_lo) / (y_hi - y_lo)) * plot_h
        label = tick_label(value, None if axes.log_y else y_spacing)
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{label}</text>')
    x_spacing = (x_ticks[1] - x_ticks[0]) if len(x_ticks) > 1 else (1.0 if integer_x else None)
    for tick in x_ticks:
        x = sx(tick)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}" stroke="#999"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" class="tick">{tick_label(tick, x_spacing)}</text>')
    parts.append(f'<text class="axis-title" x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">{escape(axes.x_title)}</text>')
    y_title = axes.y_title + (" (log)" if axes.log_y else "")
    parts.append(f'<text class="axis-title" transform="translate(14 {TOP + plot_h / 2}) rotate(-90)" '
                 f'text-anchor="middle">{escape(y_title)}</text>')
    for index, (name, values) in enumerate(series.items()):
        colour = COLOURS[index % len(COLOURS)]
        shown = smooth([y for _, y in values], smoothing)
        raw = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for (x, _), y in zip(values, shown))
        hidden = "" if smoothing > 0 else ' display="none"'  # the raw line shows behind a smoothed one
        parts.append(f'<polyline class="raw" fill="none" stroke="{colour}" stroke-width="1" opacity="0.3" '
                     f'points="{raw}"{hidden}/>')
        parts.append(f'<polyline class="series" data-series="{escape(name)}" data-points="{len(values)}" '
                     f'data-colour="{colour}" data-values="{escape(json.dumps(values))}" fill="none" '
                     f'stroke="{colour}" stroke-width="1.6" points="{coords}"><title>{escape(name)}</title></polyline>')
        if len(values) == 1:
            x, y = values[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{colour}"/>')
    parts.append(f'<line class="guide" y1="{TOP}" y2="{TOP + plot_h}" x1="0" x2="0" stroke="#888" '
                 f'stroke-dasharray="3 3" display="none"/><rect class="brush" y="{TOP}" height="{plot_h}" '
                 f'fill="#4a7bd0" opacity="0.15" display="none"/>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{COLOURS[i % len(COLOURS)]}"></i>{escape(name)}</span>'
                     for i, name in enumerate(series))
    return head + "".join(parts) + f'<div class="readout muted">&nbsp;</div><div class="legend">{legend}</div></figure>'


# The pointer's part of the charts (see the module's opening comment). It reads the numbers the
# server wrote into each SVG, so what it shows under the cursor is the data, not pixels read back.
CHART_SCRIPT = """
function smoothValues(vals,w){if(!(w>0))return vals.slice();let a=0;return vals.map((v,i)=>{a=w*a+(1-w)*v;return a/(1-Math.pow(w,i+1));});}
function fmtValue(v){const s=v.toPrecision(4);return s.includes('e')?s:String(Number(s));}
function chartScale(svg){const d=svg.dataset,n=k=>Number(d[k]);const log=d.log==='1';
  return {log,xlo:n('xLo'),xhi:n('xHi'),ylo:n('yLo'),yhi:n('yHi'),left:n('left'),top:n('top'),pw:n('plotW'),ph:n('plotH'),
    sx(x){return this.left+(x-this.xlo)/(this.xhi-this.xlo)*this.pw;},
    sy(y){const t=this.log?Math.log10(y):y;return this.top+(1-(t-this.ylo)/(this.yhi-this.ylo))*this.ph;},
    dx(px){return this.xlo+(px-this.left)/this.pw*(this.xhi-this.xlo);}};}
function chartWeight(){const s=document.getElementById('smoothing');return s?Number(s.value):0;}
function redrawChart(svg){const sc=chartScale(svg),w=chartWeight();
  svg.querySelectorAll('polyline.series').forEach(line=>{const pts=JSON.parse(line.dataset.values);
    const ys=smoothValues(pts.map(p=>p[1]),w);line.smoothed=ys;
    line.setAttribute('points',pts.map((p,i)=>sc.sx(p[0]).toFixed(1)+','+sc.sy(ys[i]).toFixed(1)).join(' '));});
  svg.querySelectorAll('polyline.raw').forEach(l=>{if(w>0)l.removeAttribute('display');else l.setAttribute('display','none');});}
function svgX(svg,event){const r=svg.getBoundingClientRect();return (event.clientX-r.left)*svg.viewBox.baseVal.width/r.width;}
function showReadout(svg,event){const sc=chartScale(svg),x=sc.dx(svgX(svg,event)),w=chartWeight();
  const box=svg.parentNode.querySelector('.readout');let nearest=null;const rows=[];
  svg.querySelectorAll('polyline.series').forEach(line=>{const pts=JSON.parse(line.dataset.values);
    const ys=line.smoothed||smoothValues(pts.map(p=>p[1]),w);let best=0;
    pts.forEach((p,i)=>{if(Math.abs(p[0]-x)<Math.abs(pts[best][0]-x))best=i;});
    if(nearest===null||Math.abs(pts[best][0]-x)<Math.abs(nearest-x))nearest=pts[best][0];
    rows.push({name:line.dataset.series,colour:line.dataset.colour,x:pts[best][0],value:ys[best],raw:pts[best][1]});});
  const shown=rows.filter(r=>r.x===nearest);const guide=svg.querySelector('.guide');
  guide.setAttribute('x1',sc.sx(nearest));guide.setAttribute('x2',sc.sx(nearest));guide.removeAttribute('display');
  box.classList.remove('muted');box.dataset.x=nearest;box.textContent='';
  const head=document.createElement('b');head.textContent=svg.dataset.xTitle+' '+nearest.toLocaleString('en-US');box.append(head);
  for(const r of shown){const span=document.createElement('span');span.className='row';span.dataset.series=r.name;
    span.dataset.value=r.value;span.style.borderLeft='10px solid '+r.colour;
    span.textContent=r.name+': '+fmtValue(r.value)+(w>0?' (raw '+fmtValue(r.raw)+')':'');box.append(span);}}
function zoomTo(lo,hi){const u=new URL(location.href),w=document.getElementById('smoothing');
  if(w)u.searchParams.set('smooth',w.value);if(lo===null){u.searchParams.delete('xmin');u.searchParams.delete('xmax');}
  else{u.searchParams.set('xmin',lo);u.searchParams.set('xmax',hi);}location.href=u.toString();}
document.querySelectorAll('svg.chart').forEach(svg=>{let start=null;const brush=svg.querySelector('.brush');
  svg.addEventListener('mousemove',e=>{showReadout(svg,e);if(start!==null){const x=svgX(svg,e);
    brush.setAttribute('x',Math.min(start,x));brush.setAttribute('width',Math.abs(x-start));brush.removeAttribute('display');}});
  svg.addEventListener('mouseleave',()=>{svg.querySelector('.guide').setAttribute('display','none');start=null;brush.setAttribute('display','none');});
  svg.addEventListener('mousedown',e=>{start=svgX(svg,e);e.preventDefault();});
  svg.addEventListener('mouseup',e=>{if(start===null)return;const x=svgX(svg,e),sc=chartScale(svg);const a=start;start=null;
    brush.setAttribute('display','none');if(Math.abs(x-a)>6)zoomTo(sc.dx(Math.min(a,x)),sc.dx(Math.max(a,x)));});
  svg.addEventListener('dblclick',()=>zoomTo(null));});
const slider=document.getElementById('smoothing');
if(slider)slider.addEventListener('input',()=>{document.getElementById('smoothing-value').textContent=Number(slider.value).toFixed(2);
  document.querySelectorAll('svg.chart').forEach(redrawChart);});
document.querySelectorAll('#chart-controls select').forEach(s=>s.addEventListener('change',()=>s.form.submit()));
"""


def short_label(label: str, limit: int = 30) -> str:
    """A box's label cut in the middle: its end (the short hash) tells two versions of one step apart."""
    if len(label) <= limit:
        return label
    tail = 12
    return label[: limit - tail - 1] + "…" + label[-tail:]


def lineage_graph(centre: str, dependencies: list[tuple[str, str | None]], dependents: list[tuple[str, str | None]],
                  link) -> str:
    """Dependencies left, the step in the middle, dependents right; ``link(path)`` gives each box's href."""
    box_w, box_h, gap = 210, 26, 10
    rows = max(len(dependencies), len(dependents), 1)
    height = rows * (box_h + gap) + gap
    width = 3 * box_w + 2 * 60
    parts = [f'<svg class="lineage" viewBox="0 0 {width} {height}" width="{width}" height="{height}">']

    def box(x: float, y: float, label: str, path: str | None, cls: str) -> str:
        text = short_label(label)
        inner = (f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="4" class="{cls}"/>'
                 f'<text x="{x + 8}" y="{y + 17}">{escape(text)}</text><title>{escape(label)}</title>')
        return f'<a href="{escape(link(path))}">{inner}</a>' if path is not None else f"<g>{inner}</g>"

    centre_y = (height - box_h) / 2
    centre_x = box_w + 60
    for column, items in ((0, dependencies), (2, dependents)):
        x = column * (box_w + 60)
        offset = (height - len(items) * (box_h + gap) + gap) / 2
        for index, (label, path) in enumerate(items):
            y = offset + index * (box_h + gap)
            x1, x2 = (x + box_w, centre_x) if column == 0 else (centre_x + box_w, x)
            y1, y2 = (y + box_h / 2, centre_y + box_h / 2) if column == 0 else (centre_y + box_h / 2, y + box_h / 2)
            parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#888" marker-end="url(#arrow)"/>')
            parts.append(box(x, y, label, path, "dep" if column == 0 else "dependent"))
    parts.insert(1, '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
                    'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#888"/></marker></defs>')
    parts.append(box(centre_x, centre_y, centre, None, "self"))
    parts.append("</svg>")
    return "".join(parts)
