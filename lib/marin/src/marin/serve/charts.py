"""Line charts as inline SVG, drawn on the server: no script or charting library in the page.

Each series is one ``<polyline>`` whose ``data-points`` attribute counts its points, so a test (or
a curious reader of the page source) can check what was drawn.
"""

from __future__ import annotations

import math
from html import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-2:
        return f"{value:.1e}"
    return f"{value:.3g}"


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], *, width: int = 520, height: int = 260) -> str:
    points = [p for values in series.values() for p in values]
    head = f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
    if not points:
        return head + '<p class="muted">no data</p></figure>'
    left, right, top, bottom = 58, 12, 10, 28
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if y_hi == y_lo:
        pad = abs(y_lo) * 0.1 or 1.0
        y_lo, y_hi = y_lo - pad, y_hi + pad
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{escape(title)}">']
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>')
    for tick in _ticks(y_lo, y_hi):
        y = sy(tick)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_label(tick)}</text>')
    for tick in _ticks(x_lo, x_hi):
        x = sx(tick)
        parts.append(f'<text x="{x:.1f}" y="{height - 10}" text-anchor="middle" class="tick">{_label(tick)}</text>')
    for index, (name, values) in enumerate(series.items()):
        colour = COLOURS[index % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
        parts.append(f'<polyline class="series" data-series="{escape(name)}" data-points="{len(values)}" fill="none" '
                     f'stroke="{colour}" stroke-width="1.5" points="{coords}"><title>{escape(name)}</title></polyline>')
        if len(values) == 1:
            x, y = values[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{COLOURS[i % len(COLOURS)]}"></i>{escape(name)}</span>'
                     for i, name in enumerate(series))
    return head + "".join(parts) + f'<div class="legend">{legend}</div></figure>'


def lineage_graph(centre: str, dependencies: list[tuple[str, str | None]], dependents: list[tuple[str, str | None]],
                  link) -> str:
    """Dependencies left, the step in the middle, dependents right; ``link(path)`` gives each box's href."""
    box_w, box_h, gap = 210, 26, 10
    rows = max(len(dependencies), len(dependents), 1)
    height = rows * (box_h + gap) + gap
    width = 3 * box_w + 2 * 60
    parts = [f'<svg class="lineage" viewBox="0 0 {width} {height}" width="{width}" height="{height}">']

    def box(x: float, y: float, label: str, path: str | None, cls: str) -> str:
        text = label if len(label) <= 30 else label[:29] + "…"
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
