"""The HTML of each page, built from plain strings; every value from disk goes through ``escape``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

from marin.execution.reproducibility.explain import flatten_attributes
from marin.serve.attempts import AttemptRow, LogWindow
from marin.serve.charts import CHART_SCRIPT, Axes, line_chart, lineage_graph, value_text
from marin.serve.compare import Comparison
from marin.serve.data import CUT_KEY, Page
from marin.serve.runs import CHARTS, by_tokens, chart_series
from marin.serve.steps import StepDetail, StepRow

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#222}
header{background:#23395d;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:baseline}
header a{color:#fff;text-decoration:none}header .prefix{opacity:.7;font-size:12px;margin-left:auto}
main{padding:12px 16px}table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f6f6f6}.muted{color:#888}.mono,code,pre{font-family:ui-monospace,monospace;font-size:12px}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:420px}
.SUCCESS{color:#1a7f37}.FAILED,.DEP_FAILED{color:#c62828}.RUNNING{color:#b26a00;font-weight:bold}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:12px 18px}
figure.chart{margin:0;min-width:0}figure.chart figcaption{font-weight:bold}svg.chart{width:100%;height:auto;display:block;cursor:crosshair;user-select:none}
.tick{font-size:11px;fill:#555}.axis-title{font-size:12px;fill:#333}.readout{font-size:12px;min-height:1.5em}.readout .row{margin-left:10px;padding-left:4px}
.controls{background:#f6f6f6;padding:6px 8px}.controls input[type=range]{vertical-align:middle}pre.sample{white-space:pre-wrap;max-width:100ch}
.wide{overflow-x:auto;max-width:100%}table#comparison td,table#comparison th{max-width:22ch;overflow-wrap:anywhere}table.sortable th[data-key]{cursor:pointer}th[data-order=asc]:after{content:" ▲"}th[data-order=desc]:after{content:" ▼"}
.newest{color:#1a7f37;font-size:11px;border:1px solid #1a7f37;border-radius:3px;padding:0 3px;margin-left:4px}.older{color:#888;font-size:11px;margin-left:4px}
.legend .key{margin-right:10px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
.lineage text{font-size:11px}.lineage rect{fill:#eef3fb;stroke:#8aa4cc}.lineage rect.self{fill:#fff3d6;stroke:#c9a13b}
.tok span:nth-child(odd){background:#dcebff}.tok span:nth-child(even){background:#ffe6cc}.tok{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}
.error{border:1px solid #c62828;background:#fdecea;padding:10px}.problem{color:#c62828;font-size:12px}
.SUCCEEDED{color:#1a7f37}.TIMED_OUT,.UNREADABLE{color:#c62828}.PREEMPTED,.STOPPED{color:#b26a00}
pre.log{max-height:70vh;white-space:pre-wrap}
"""


def link(route: str, **params: Any) -> str:
    query = urlencode([(k, v) for k, values in params.items() for v in (values if isinstance(values, list) else [values]) if v is not None])
    return f"{route}?{query}" if query else route


def layout(title: str, body: str, prefix: str) -> str:
    nav = "".join(f'<a href="{href}">{name}</a>' for name, href in
                  (("Steps", "/"), ("Training", "/runs"), ("Evaluations", "/evals"), ("Scaling", "/scaling"),
                   ("Data", "/data")))
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)} · marin</title>'
            f"<style>{STYLE}</style></head><body><header><b>marin</b>{nav}"
            f'<span class="prefix">{escape(prefix)}</span></header><main><h2>{escape(title)}</h2>{body}</main></body></html>')


def error_page(title: str, message: str, status: int, prefix: str) -> str:
    return layout(f"{status} {title}", f'<div class="error">{escape(message)}</div><p><a href="/">back to the steps</a></p>', prefix)


def seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def version_badge(newest: bool | None) -> str:
    """Marks which of several outputs of one step name is the newest (``None``: the name is unique)."""
    if newest is None:
        return ""
    return '<span class="newest">newest</span>' if newest else '<span class="older">older</span>'


def _problems_html(problems: tuple[str, ...]) -> str:
    """Records that were not read (a FIFO, a device, too large, damaged), each naming the file and why."""
    return "".join(f'<div class="problem">{escape(problem)}</div>' for problem in problems)


def _row_html(row: StepRow, now: float, newest: bool | None = None) -> str:
    data = row.to_json(now)
    status = row.status or "-"
    damaged = ' <span class="FAILED">(damaged record)</span>' if row.record_damaged else ""
    damaged = version_badge(newest) + damaged + _problems_html(row.problems)
    return (f'<tr data-name="{escape(row.name)}" data-status="{escape(status)}">'
            f'<td><a href="{escape(link("/step", path=row.path))}">{escape(row.name)}</a>{damaged}</td>'
            f'<td class="{escape(status)}">{escape(status)}</td><td>{seconds_text(data["age_seconds"])}</td>'
            f'<td>{seconds_text(data["duration_seconds"])}</td><td class="mono">{escape(row.short_hash)}</td>'
            f'<td class="mono muted">{escape(row.path)}</td></tr>')


# The list re-renders itself from /api/steps: every 3 s while a step runs, every 15 s otherwise.
LIST_SCRIPT = """
const box=document.getElementById('filter'), body=document.querySelector('#steps tbody');
function esc(s){return String(s??'').replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
function dur(s){if(s==null)return '-';for(const [u,n] of [['d',86400],['h',3600],['m',60]])if(s>=n)return (s/n).toFixed(1)+u;return s.toFixed(1)+'s';}
function applyFilter(){const q=box.value.toLowerCase();for(const tr of body.rows){
  tr.hidden=q&&!(tr.dataset.name.toLowerCase().includes(q)||tr.dataset.status.toLowerCase().includes(q));}}
function render(steps){body.innerHTML=steps.map(s=>{const st=s.status||'-';
  const badge=s.newest===true?'<span class="newest">newest</span>':s.newest===false?'<span class="older">older</span>':'';
  return `<tr data-name="${esc(s.name)}" data-status="${esc(st)}"><td><a href="/step?path=${encodeURIComponent(s.path)}">${esc(s.name)}</a>${badge}${s.record_damaged?' <span class="FAILED">(damaged record)</span>':''}${(s.problems||[]).map(p=>`<div class="problem">${esc(p)}</div>`).join('')}</td>`+
  `<td class="${esc(st)}">${esc(st)}</td><td>${dur(s.age_seconds)}</td><td>${dur(s.duration_seconds)}</td><td class="mono">${esc(s.short_hash)}</td><td class="mono muted">${esc(s.path)}</td></tr>`}).join('');
  document.getElementById('count').textContent=steps.length; applyFilter();}
async function refresh(){let running=false;try{const r=await fetch('/api/steps');if(r.ok){const d=await r.json();render(d.steps);
  running=d.steps.some(s=>s.status==='RUNNING');document.getElementById('updated').textContent=new Date().toLocaleTimeString();}}catch(e){}
  setTimeout(refresh, running?3000:15000);}
box.addEventListener('input',applyFilter);
setTimeout(refresh, document.querySelector('tr[data-status="RUNNING"]')?3000:15000);
"""


def step_list_page(rows: list[StepRow], prefix: str, newest: dict[str, bool | None] | None = None) -> str:
    now = time.time()
    newest = newest or {}
    body = (f'<p><input id="filter" placeholder="filter by name or status" size="40"> '
            f'<span class="muted"><span id="count">{len(rows)}</span> steps · updated <span id="updated">now</span></span></p>'
            '<table id="steps"><thead><tr><th>step</th><th>status</th><th>age</th><th>duration</th><th>hash</th><th>folder</th></tr></thead>'
            f'<tbody>{"".join(_row_html(r, now, newest.get(r.path)) for r in rows)}</tbody></table><script>{LIST_SCRIPT}</script>')
    return layout("Steps", body, prefix)


def _json_block(value: Any) -> str:
    return f"<pre>{escape(json.dumps(value, indent=2, sort_keys=True, default=str))}</pre>"


def _attempts_table(path: str, attempts: list[AttemptRow]) -> str:
    if not attempts:
        return '<p class="muted" id="no-attempts">no attempts recorded in this step\'s folder</p>'
    head = ("<tr><th>attempt</th><th>engine</th><th>engine job</th><th>iris job</th><th>its attempt</th><th>outcome</th>"
            "<th>exit codes</th><th>duration</th><th>reason</th><th>logs</th></tr>")
    rows = []
    for row in attempts:
        logs = " ".join(f'<a class="log-link" href="{escape(link("/log", path=path, attempt=row.attempt, replica=r))}">'
                        f"replica {r}</a>" for r in row.replicas) or '<span class="muted">none</span>'
        codes = ", ".join("?" if code is None else str(code) for code in row.exit_codes) or "-"
        first = row.replicas[0] if row.replicas else 0
        rows.append(f'<tr data-attempt="{row.attempt}" data-outcome="{escape(row.outcome)}">'
                    f'<td><a href="{escape(link("/log", path=path, attempt=row.attempt, replica=first))}">{row.attempt}</a></td>'
                    f"<td>{escape(row.engine or '-')}</td>"
                    f"<td class=\"mono engine-job\">{escape(', '.join(row.engine_jobs) or '-')}</td>"
                    f"<td class=\"mono\">{escape(row.job_id or '-')}</td>"
                    f"<td>{'-' if row.job_attempt is None else row.job_attempt}</td>"
                    f'<td class="{escape(row.outcome)}">{escape(row.outcome)}</td><td>{escape(codes)}</td>'
                    f"<td>{seconds_text(row.duration_seconds)}</td><td>{escape(row.reason or '')}</td><td>{logs}</td></tr>")
    return f'<table id="attempts"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def step_page(detail: StepDetail, prefix: str, compare: str | None, differences: list[str] | None,
              attempts: list[AttemptRow] | None = None, training: bool = False) -> str:
    """``training``: the step has a ``metrics.jsonl``, committed or (while it runs) in its staging folder."""
    row, info = detail.row, detail.info
    attrs = "".join(f'<tr><td class="mono">{escape(k)}</td><td class="mono">{escape(json.dumps(v, default=str))}</td></tr>'
                    for k, v in flatten_attributes(info.get("hash_attrs") or {}).items())
    summary = (f'<table><tr><th>status</th><td class="{escape(row.status or "")}">{escape(row.status or "-")}</td></tr>'
               f'<tr><th>identity</th><td class="mono">{escape(row.identity or "-")}</td></tr>'
               f'<tr><th>version</th><td>{escape(str(row.version))}</td></tr>'
               f'<tr><th>function</th><td class="mono">{escape(str(info.get("fn", "-")))}</td></tr>'
               f'<tr><th>duration</th><td>{seconds_text(row.duration())}</td></tr>'
               f'<tr><th>folder</th><td class="mono">{escape(row.path)}</td></tr>'
               + (f'<tr><th>error</th><td class="FAILED">{escape(row.error)}</td></tr>' if row.error else "")
               + (f"<tr><th>not read</th><td>{_problems_html(row.problems)}</td></tr>" if row.problems else "") + "</table>")
    if training or any(f["name"] == "metrics.jsonl" for f in detail.files):  # a training run: its curves are one click away
        summary += f'<p><a id="training-curves" href="{escape(link("/runs", run=row.path))}">training curves</a></p>'
    parts = [summary, "<h3>Attempts</h3>", _attempts_table(row.path, attempts or []), "<h3>Hash attributes</h3>", f"<table id=\"hash-attrs\">{attrs}</table>" if attrs else '<p class="muted">none</p>']
    parts.append("<h3>Lineage</h3>")
    graph = lineage_graph(f"{row.name} {row.short_hash}",
                          [(f"{d['name']} {str(d['identity'] or '')[:8]}", d["path"]) for d in detail.dependencies],
                          [(f"{d.name} {d.short_hash}", d.path) for d in detail.dependents],
                          lambda path: link("/step", path=path))
    parts.append(graph)
    parts.append("<h3>Other versions of this step</h3>")
    if detail.other_versions:
        options = "".join(f'<option value="{escape(o.path)}"{" selected" if o.path == compare else ""}>'
                          f'{escape(o.short_hash)} {escape(o.status or "-")} {escape(o.path)}</option>' for o in detail.other_versions)
        parts.append(f'<form method="get" action="/step"><input type="hidden" name="path" value="{escape(row.path)}">'
                     f'<select name="compare">{options}</select> <button>compare</button></form>')
    else:
        parts.append('<p class="muted">none under this prefix</p>')
    if differences is not None:
        items = "".join(f"<li class=\"mono\">{escape(d)}</li>" for d in differences) or "<li>identical identities</li>"
        parts.append(f'<h4>What differs: this → {escape(compare or "")}</h4><ul id="differences">{items}</ul>')
    parts.append("<h3>Files</h3><table>")
    for f in detail.files:
        target = f"{row.path}/{f['name']}"
        size = "" if f["type"] == "directory" else f"{f['size'] or 0:,} B"
        parts.append(f'<tr><td><a href="{escape(link("/data", path=target))}">{escape(f["name"])}{"/" if f["type"] == "directory" else ""}</a></td>'
                     f"<td>{size}</td></tr>")
    parts.append("</table>")
    parts.append(f'<h3>.executor_info</h3>{_json_block(info)}<h3>.artifact.json</h3>'
                 + (_json_block(detail.artifact) if detail.artifact is not None else '<p class="muted">none</p>'))
    parts.append(f'<p><a href="{escape(link("/api/step", path=row.path))}">as JSON</a></p>')
    return layout(f"{row.name} {row.short_hash}", "".join(parts), prefix)


# Sorts the comparison table by the clicked column (numbers as numbers, a second click reverses).
SORT_SCRIPT = """
document.querySelectorAll('table.sortable th[data-key]').forEach((th,col)=>th.addEventListener('click',()=>{
  const table=th.closest('table'),body=table.tBodies[0],down=th.dataset.order!=='asc';
  table.querySelectorAll('th').forEach(h=>{delete h.dataset.order;});th.dataset.order=down?'asc':'desc';
  const key=tr=>{const v=tr.cells[col+1].dataset.sort;const n=Number(v);return v!==''&&!isNaN(n)?n:v;};
  const rows=[...body.rows].sort((a,b)=>{const x=key(a),y=key(b);const c=typeof x==='number'&&typeof y==='number'?x-y:String(x).localeCompare(String(y));
    return down?c:-c;});rows.forEach(r=>body.append(r));}));
"""


@dataclass(frozen=True)
class ChartView:
    """What the runs page's controls chose: smoothing weight, x by step or tokens, log y, zoomed x range."""

    smoothing: float = 0.0
    x_axis: str = "step"  # or "tokens"
    log_y: bool = False
    x_range: tuple[float, float] | None = None


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f'<td class="mono" data-sort="{value!r}">{escape(value_text(value))}</td>'
    text = "-" if value is None else value if isinstance(value, str) else json.dumps(value, default=str)
    return f'<td class="mono" data-sort="{escape(text)}">{escape(text)}</td>'


def comparison_table(comparison: Comparison, names: dict[str, str]) -> str:
    """What each run was trained with, then the settings that differ, then the final metrics."""
    columns = [*comparison.leading, *comparison.settings, *comparison.metrics]
    kinds = {**dict.fromkeys(comparison.leading, "leading"), **dict.fromkeys(comparison.settings, "setting"),
             **dict.fromkeys(comparison.metrics, "metric")}
    head = "".join(f'<th data-key="{escape(c)}" class="{kinds[c]}" title="{escape(c)}: click to sort">'
                   f"{escape(c.removeprefix('hash_attrs.'))}</th>" for c in columns)
    rows = "".join(f'<tr data-run="{escape(path)}"><td>{escape(names.get(path, path))}</td>'
                   + "".join(_cell(comparison.values[path].get(c)) for c in columns) + "</tr>"
                   for path in comparison.runs)
    leading_differ = any(len({repr(comparison.values[p].get(c)) for p in comparison.runs}) > 1 for c in comparison.leading)
    note = ("" if comparison.settings else
            f'<p class="muted">no {"other " if leading_differ else ""}settings differ between these runs</p>')
    return (f'<h3>Comparison</h3><p class="muted">each run\'s optimizer and peak learning rate, then only the settings '
            f'that differ (as <code>marin explain A B</code> compares them, the optimizer\'s first), then the final '
            f'metrics; click a heading to sort</p>'
            f'<div class="wide"><table id="comparison" class="sortable"><thead><tr><th>run</th>{head}</tr></thead>'
            f'<tbody>{rows}</tbody></table></div>{note}<script>{SORT_SCRIPT}</script>')


def _controls(view: ChartView) -> str:
    def options(name: str, chosen: str, choices: tuple[str, ...]) -> str:
        inner = "".join(f'<option value="{c}"{" selected" if c == chosen else ""}>{c}</option>' for c in choices)
        return f'<select name="{name}" id="{name}-axis">{inner}</select>'

    zoom = ""
    if view.x_range is not None:
        lo, hi = view.x_range
        zoom = (f' · <span id="zoom">{escape(view.x_axis)} {lo:,.0f}–{hi:,.0f}</span> '
                f'<a id="reset-zoom" href="#" onclick="zoomTo(null);return false">reset zoom</a>')
    return (f'<p class="controls">smoothing <input type="range" id="smoothing" name="smooth" min="0" max="0.99" step="0.01" '
            f'value="{view.smoothing}"> <span id="smoothing-value">{view.smoothing:.2f}</span> · '
            f'x {options("x", view.x_axis, ("step", "tokens"))} · y {options("y", "log" if view.log_y else "linear", ("linear", "log"))}'
            f'{zoom} <span class="muted">· hover for values, drag across a chart to zoom, double-click to zoom out</span></p>')


def runs_page(runs: list[StepRow], selected: list[str], series_by_run: dict[str, dict], extras: dict[str, dict],
              prefix: str, view: ChartView = ChartView(), comparison: Comparison | None = None) -> str:
    now = time.time()
    checks = "".join(f'<label><input type="checkbox" name="run" value="{escape(r.path)}"{" checked" if r.path in selected else ""}>'
                     f' {escape(r.name)} <span class="mono muted">{escape(r.short_hash)}</span>'
                     f' <span class="muted">{seconds_text(r.to_json(now)["age_seconds"])} ago</span></label><br>' for r in runs)
    if not checks:
        return layout("Training runs", '<p class="muted">no training runs (no metrics.jsonl) under this prefix</p>', prefix)
    parts = [f'<form method="get" action="/runs" id="chart-controls"><div class="runs">{checks}</div>'
             f'<button>show</button>{_controls(view)}</form>']
    names = {r.path: f"{r.name} {r.short_hash}" for r in runs}
    if comparison is not None and len(comparison.runs) > 1:
        parts.append(comparison_table(comparison, names))
    axes_x = "tokens" if view.x_axis == "tokens" else "step"
    charts, not_logged = [], []
    for title, pattern, y_title in CHARTS:
        overlaid: dict[str, list] = {}
        for path in selected:
            series = series_by_run.get(path, {})
            for label, points in chart_series(by_tokens(series) if axes_x == "tokens" else series, pattern).items():
                key = names.get(path, path) if "*" not in pattern else f"{names.get(path, path)} · {label}"
                overlaid[key] = points
        if not overlaid and view.x_range is None:
            not_logged.append(title)  # a panel saying "no data" tells less than one line naming them all
            continue
        axes = Axes(x_title=axes_x, y_title=y_title, log_y=view.log_y, x_range=view.x_range)
        charts.append(line_chart(title, overlaid, axes, smoothing=view.smoothing))
    parts.append(f'<div class="charts">{"".join(charts)}</div><script>{CHART_SCRIPT}</script>')
    if not_logged and selected:
        parts.append(f'<p class="muted" id="not-logged">not logged by these runs: {escape(", ".join(not_logged))}</p>')
    for path in selected:
        extra = extras.get(path) or {}
        if extra.get("problem"):
            parts.append(f"<h3>Not charted: {escape(names.get(path, path))}</h3>{_problems_html((extra['problem'],))}")
        if extra.get("samples"):
            parts.append(f"<h3>Samples: {escape(names.get(path, path))}</h3>"
                         + "".join(f'<pre class="sample">{escape(s)}</pre>' for s in extra["samples"]))
        if extra.get("model_card"):
            parts.append(f"<h3>Model card: {escape(names.get(path, path))}</h3><pre class=\"sample\">{escape(extra['model_card'])}</pre>")
    return layout("Training runs", "".join(parts), prefix)


def evals_page(columns: list[str], table: dict[str, dict[str, float]], prefix: str) -> str:
    if not columns:
        return layout("Evaluations", '<p class="muted">no evaluation results (eval steps or eval.json) under this prefix</p>', prefix)
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(f"<tr><td>{escape(metric)}</td>" + "".join(
        f'<td class="mono">{values[c]:.4f}</td>' if c in values else "<td>-</td>" for c in columns) + "</tr>"
        for metric, values in sorted(table.items()))
    return layout("Evaluations", f'<table id="evals"><thead><tr><th>metric</th>{head}</tr></thead><tbody>{body}</tbody></table>', prefix)


def _pager(path: str, page: Page, count: int) -> str:
    links = []
    if page.start > 0:
        links.append(f'<a href="{escape(link("/data", path=path, start=max(0, page.start - count), count=count))}">← previous</a>')
    if page.has_more and page.next_start is not None:
        links.append(f'<a href="{escape(link("/data", path=path, start=page.next_start, count=count))}">next →</a>')
    total = f" of {page.total:,}" if page.total is not None else ""
    shown = f"rows {page.start:,}–{page.start + len(page.rows) - 1:,}{total}" if page.rows else f"no rows from {page.start:,}{total}"
    return f'<p>{shown} {" · ".join(links)}</p>'


def data_page(path: str, page: Page, count: int, listing: list[dict[str, Any]] | None, prefix: str) -> str:
    crumbs = ['<a href="/data">prefix</a>']
    walked = []
    for part in [p for p in path.split("/") if p]:
        walked.append(part)
        crumbs.append(f'<a href="{escape(link("/data", path="/".join(walked)))}">{escape(part)}</a>')
    parts = [f'<p class="mono">{" / ".join(crumbs)}</p>']
    if page.note:
        parts.append(f'<p class="muted">{escape(page.note)}</p>')
    if page.kind == "folder":
        parts.append("<table>")
        for f in listing or []:
            target = f"{path}/{f['name']}" if path else f["name"]
            size = "" if f["type"] == "directory" else f"{f['size'] or 0:,} B"
            parts.append(f'<tr><td><a href="{escape(link("/data", path=target))}">{escape(f["name"])}'
                         f'{"/" if f["type"] == "directory" else ""}</a></td><td>{size}</td></tr>')
        parts.append("</table>")
    elif page.kind == "text":
        parts.append(f"<pre>{escape(page.rows[0])}</pre>")
    elif page.kind == "tokens":
        parts.append(_pager(path, page, count))
        for row in page.rows:
            parts.append(f'<h4>document {row["document"]:,} <span class="muted">({row["length"]:,} tokens)</span></h4>')
            if row["pieces"] is not None:
                spans = "".join(f'<span title="{i}">{escape(p)}</span>' for i, p in zip(row["ids"], row["pieces"]))
                parts.append(f'<div class="tok" data-tokens="{len(row["ids"])}">{spans}</div>')
            else:
                parts.append(f'<div class="mono">{" ".join(str(i) for i in row["ids"])}</div>')
        parts.append(_pager(path, page, count))
    else:
        parts.append(_pager(path, page, count))
        parts.append('<table id="rows">')
        for offset, row in enumerate(page.rows):
            text = json.dumps(row, ensure_ascii=False, default=str)
            if isinstance(row, dict) and CUT_KEY in row:  # too long to show: its size, then its start
                size = row.get("bytes", row.get("bytes_at_least"))
                text = f"(cut: {'' if 'bytes' in row else 'at least '}{size:,} bytes) {row[CUT_KEY]}"
            if len(text) > 4000:
                text = text[:4000] + " …"
            parts.append(f'<tr><td class="muted">{page.start + offset}</td><td class="mono">{escape(text)}</td></tr>')
        parts.append("</table>")
        parts.append(_pager(path, page, count))
    return layout(f"Data: {path or 'prefix'}", "".join(parts), prefix)


# Follows a running attempt's log: asks for what was written after the window's end every 2 s,
# appends it as text (never as HTML), and stops when the attempt's record has an outcome.
LOG_SCRIPT = """
const box=document.getElementById('log'), follow=document.getElementById('follow'), state=document.getElementById('follow-state');
let end=Number(box.dataset.end), busy=false;
async function poll(){if(busy||!follow.checked)return;busy=true;let again=2000;
  try{const r=await fetch('/api/log?'+box.dataset.query+'&offset='+end);if(r.ok){const d=await r.json();
    if(d.text){const bottom=box.scrollTop+box.clientHeight>=box.scrollHeight-4;box.append(d.text);if(bottom)box.scrollTop=box.scrollHeight;}
    end=d.end;box.dataset.end=end;document.getElementById('window-end').textContent=d.end.toLocaleString('en-US');
    document.getElementById('window-size').textContent=d.size.toLocaleString('en-US');
    if(d.end<d.size)again=0;else if(d.finished){state.textContent='attempt ended: '+d.outcome;follow.checked=false;again=null;
      const line=document.getElementById('attempt-line');if(line&&d.description){line.textContent=d.description;line.className=d.outcome;}}
    else state.textContent='following · '+new Date().toLocaleTimeString();}}catch(e){}
  busy=false;if(again!==null)setTimeout(poll,again);}
follow.addEventListener('change',()=>{if(follow.checked)poll();});
if(follow.checked)setTimeout(poll,2000);
"""


def log_page(path: str, attempt: int, replica: int, window: LogWindow, row: AttemptRow | None, prefix: str) -> str:
    title = f"{path}: attempt {attempt}, replica {replica}"
    parts = [f'<p><a href="{escape(link("/step", path=path))}">← the step</a></p>']
    if row is not None:
        parts.append(f'<p id="attempt-line" class="{escape(row.outcome)}">{escape(row.description)}</p>')
        if len(row.replicas) > 1:
            tabs = " · ".join(f"<b>replica {r}</b>" if r == replica else
                              f'<a href="{escape(link("/log", path=path, attempt=attempt, replica=r))}">replica {r}</a>'
                              for r in row.replicas)
            parts.append(f"<p>{tabs}</p>")
    here = {"path": path, "attempt": attempt, "replica": replica}
    nav = []
    if window.start > 0:
        nav.append(f'<a id="earlier" href="{escape(link("/log", **here, before=window.start))}">← earlier</a>')
    if window.end < window.size:
        nav.append(f'<a id="later" href="{escape(link("/log", **here, offset=window.end))}">later →</a>')
        nav.append(f'<a id="tail" href="{escape(link("/log", **here))}">the end</a>')
    at_tail = window.end >= window.size
    running = row is not None and not row.finished
    shown = (f'bytes {window.start:,}–<span id="window-end">{window.end:,}</span> '
             f'of <span id="window-size">{window.size:,}</span>')
    parts.append(f'<p class="muted">{shown} {" · ".join(nav)}</p>')
    if running and at_tail:
        parts.append('<p><label><input type="checkbox" id="follow" checked> follow</label> '
                     '<span class="muted" id="follow-state">following</span></p>')
    query = link("", **here).lstrip("?")
    parts.append(f'<pre class="log" id="log" data-end="{window.end}" data-query="{escape(query)}">{escape(window.text)}</pre>')
    if running and at_tail:
        parts.append(f"<script>{LOG_SCRIPT}</script>")
    return layout(title, "".join(parts), prefix)
