"""The web application: routes that read the prefix and hand what they read to :mod:`marin.serve.pages`.

FastAPI (on Starlette) gives query-parameter parsing with types, JSON responses and exception
handlers in a few lines; uvicorn serves it. Every route is a GET and none writes anything.
Files are read only where they are regular files inside the prefix (a FIFO or a device is refused,
never waited on, so no request can hold a worker for good). Errors a request can cause
(:class:`~marin.serve.errors.ServeError`, a refused file) become an error page with their status;
anything else becomes a 500 page with a one-line message, the traceback going only to the
server's log.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError
from starlette.exceptions import HTTPException as StarletteHTTPException

from marin.execution.records.executor_files import CorruptRecordError
from marin.scaling.analysis import analyse
from marin.serve import pages
from marin.serve.attempts import LOG_WINDOW_BYTES, log_url, read_window, step_attempts
from marin.serve.compare import compare_runs
from marin.serve.data import kind_of, read_page
from marin.serve.errors import ServeError, UnreadableError
from marin.serve.paths import clean_relative, resolve
from marin.serve.runs import evaluation_table, is_training_run, run_extras, run_metrics
from marin.serve.scaling_page import scaling_page
from marin.serve.steps import list_files, list_rows, newest_first, step_detail, version_differences, version_marks

logger = logging.getLogger(__name__)

DEFAULT_RUNS = 3  # /runs with nothing chosen shows the newest few runs, as one opens a dashboard on today's work
# Bootstrap refits behind /scaling's intervals: fewer than `marin scaling`'s 200, so a sweep of a few
# dozen runs answers in about a second; the intervals are rougher, the fitted values the same.
SCALING_BOOTSTRAP = 50


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def create_app(prefix: str) -> FastAPI:
    prefix = fsx.absolute(prefix).rstrip("/")
    app = FastAPI(title="marin serve", docs_url=None, redoc_url=None, openapi_url=None)

    def error_response(request: Request, status: int, title: str, message: str) -> Any:
        if _wants_json(request):
            return JSONResponse({"error": title, "message": message}, status_code=status)
        return HTMLResponse(pages.error_page(title, message, status, prefix), status_code=status)

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> Any:
        return error_response(request, exc.status, exc.title, str(exc))

    @app.exception_handler(CorruptRecordError)
    async def corrupt_record(request: Request, exc: CorruptRecordError) -> Any:
        return error_response(request, UnreadableError.status, UnreadableError.title, str(exc))

    @app.exception_handler(RefusedFileError)
    async def refused_file(request: Request, exc: RefusedFileError) -> Any:
        return error_response(request, UnreadableError.status, UnreadableError.title, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Any:
        return error_response(request, exc.status_code, "Not found" if exc.status_code == 404 else "Error", str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Any:
        logger.exception("marin serve: %s failed", request.url)
        return error_response(request, 500, "Server error", f"{type(exc).__name__}: {exc}")

    @app.exception_handler(422)
    async def bad_parameters(request: Request, exc: Exception) -> Any:
        errors = getattr(exc, "errors", list)()
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" for e in errors) or str(exc)
        return error_response(request, 400, "Bad request", message)

    # -- steps ------------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse)
    def step_list() -> str:
        rows = list_rows(prefix)
        return pages.step_list_page(rows, prefix, version_marks(rows))

    @app.get("/api/steps")
    def step_list_json() -> dict[str, Any]:
        now = time.time()
        rows = list_rows(prefix)
        marks = version_marks(rows)
        return {"prefix": prefix, "time": now, "steps": [{**row.to_json(now), "newest": marks[row.path]} for row in rows]}

    @app.get("/step", response_class=HTMLResponse)
    def step(path: str, compare: str | None = None) -> str:
        path = clean_relative(path)
        detail = step_detail(prefix, path)
        differences = version_differences(prefix, path, clean_relative(compare)) if compare else None
        return pages.step_page(detail, prefix, compare, differences, step_attempts(prefix, path),
                               training=is_training_run(prefix, detail.row))

    @app.get("/api/step")
    def step_json(path: str, compare: str | None = None) -> dict[str, Any]:
        path = clean_relative(path)
        detail = step_detail(prefix, path)
        return {
            "step": detail.row.to_json(),
            "executor_info": detail.info,
            "artifact": detail.artifact,
            "dependencies": detail.dependencies,
            "dependents": [row.path for row in detail.dependents],
            "other_versions": [row.path for row in detail.other_versions],
            "files": detail.files,
            "differences": version_differences(prefix, path, clean_relative(compare)) if compare else None,
            "attempts": [row.to_json() for row in step_attempts(prefix, path)],
        }

    # -- attempts and their logs ------------------------------------------------------------------

    @app.get("/api/attempts")
    def attempts_json(path: str) -> dict[str, Any]:
        path = clean_relative(path)
        return {"path": path, "attempts": [row.to_json() for row in step_attempts(prefix, path)]}

    @app.get("/log", response_class=HTMLResponse)
    def log_page(path: str, attempt: int, replica: int = 0, offset: int | None = None, before: int | None = None) -> str:
        path = clean_relative(path)
        window = read_window(log_url(prefix, path, attempt, replica), offset=offset, before=before)
        rows = step_attempts(prefix, path)
        current = next((row for row in rows if row.attempt == attempt), None)
        return pages.log_page(path, attempt, replica, window, current, prefix)

    @app.get("/api/log")
    def log_json(path: str, attempt: int, replica: int = 0, offset: int | None = None, before: int | None = None,
                 limit: int = LOG_WINDOW_BYTES) -> dict[str, Any]:
        path = clean_relative(path)
        window = read_window(log_url(prefix, path, attempt, replica), offset=offset, before=before, limit=limit)
        current = next((row for row in step_attempts(prefix, path) if row.attempt == attempt), None)
        return {"path": path, "attempt": attempt, "replica": replica, **window.to_json(),
                "finished": current is not None and current.finished, "outcome": current.outcome if current else None,
                "description": current.description if current else None}

    # -- training runs and evaluations ------------------------------------------------------------

    @app.get("/runs", response_class=HTMLResponse)
    def runs(run: Annotated[list[str], Query()] = [], smooth: float = 0.0, x: str = "step",  # noqa: B006 - FastAPI copies defaults
             y: str = "linear", xmin: float | None = None, xmax: float | None = None) -> str:
        training = newest_first([row for row in list_rows(prefix) if is_training_run(prefix, row)])
        selected = [clean_relative(r) for r in run] or [row.path for row in training[:DEFAULT_RUNS]]
        series, extras = {}, {}
        for path in selected:
            extras[path] = run_extras(prefix, path)
            try:
                series[path] = run_metrics(prefix, path)
            except UnreadableError as exc:  # one run's refused metrics file: shown, the others still charted
                series[path] = {}
                extras[path]["problem"] = str(exc)
        zoom = (min(xmin, xmax), max(xmin, xmax)) if xmin is not None and xmax is not None else None
        view = pages.ChartView(smoothing=min(max(smooth, 0.0), 0.99), x_axis="tokens" if x == "tokens" else "step",
                               log_y=y == "log", x_range=zoom)
        comparison = compare_runs(prefix, selected, series) if len(selected) > 1 else None
        return pages.runs_page(training, selected, series, extras, prefix, view, comparison)

    @app.get("/api/compare")
    def compare_json(run: Annotated[list[str], Query()] = []) -> dict[str, Any]:  # noqa: B006
        selected = [clean_relative(r) for r in run]
        comparison = compare_runs(prefix, selected, {path: run_metrics(prefix, path) for path in selected})
        return {"runs": comparison.runs, "metrics": comparison.metrics, "settings": comparison.settings,
                "values": comparison.values}

    @app.get("/api/metrics")
    def metrics_json(path: str) -> dict[str, Any]:
        path = clean_relative(path)
        return {"path": path, "series": {key: [list(p) for p in points] for key, points in run_metrics(prefix, path).items()}}

    @app.get("/evals", response_class=HTMLResponse)
    def evals() -> str:
        columns, table = evaluation_table(prefix, list_rows(prefix))
        return pages.evals_page(columns, table, prefix)

    @app.get("/api/evals")
    def evals_json() -> dict[str, Any]:
        columns, table = evaluation_table(prefix, list_rows(prefix))
        return {"models": columns, "metrics": table}

    # -- scaling laws -----------------------------------------------------------------------------

    @app.get("/scaling", response_class=HTMLResponse)
    def scaling(steps: str | None = None, validation: str | None = None) -> str:
        analysis = analyse(prefix, steps=steps or None, validation=validation or None, bootstrap=SCALING_BOOTSTRAP)
        return scaling_page(analysis, analysis.default_budgets(), prefix, validation or None)

    @app.get("/api/scaling")
    def scaling_json(steps: str | None = None, validation: str | None = None) -> dict[str, Any]:
        analysis = analyse(prefix, steps=steps or None, validation=validation or None, bootstrap=SCALING_BOOTSTRAP)
        return analysis.to_json(analysis.default_budgets())

    # -- data -------------------------------------------------------------------------------------

    @app.get("/data", response_class=HTMLResponse)
    def data(path: str = "", start: int = 0, count: int = 20, max_tokens: int = 512) -> str:
        path = clean_relative(path)
        url = resolve(prefix, path)
        page = read_page(url, start, count, max_tokens=max_tokens, prefix=prefix)
        listing = list_files(url) if page.kind == "folder" else None
        return pages.data_page(path, page, max(1, min(200, count)), listing, prefix)

    @app.get("/api/data")
    def data_json(path: str, start: int = 0, count: int = 20, max_tokens: int = 512) -> dict[str, Any]:
        path = clean_relative(path)
        url = resolve(prefix, path)
        if kind_of(url) == "folder":
            return {"path": path, "kind": "folder", "files": list_files(url)}
        page = read_page(url, start, count, max_tokens=max_tokens, prefix=prefix)
        return {"path": path, "kind": page.kind, "start": page.start, "rows": page.rows, "total": page.total,
                "has_more": page.has_more, "next_start": page.next_start, "note": page.note}

    return app
