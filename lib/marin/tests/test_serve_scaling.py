"""``marin serve``'s scaling page on hand-made sweeps: finished train runs whose losses follow a known law.

No model is trained: each run is a step folder holding what ``train_lm`` leaves (a SUCCESS status,
an ``.executor_info`` whose annotations declare the sweep's budget, a ``TrainedModel`` artifact),
its loss computed from L = E + A/N^alpha + B/D^beta at D = C/(6N).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from html import unescape
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient
from marin.execution.records.executor_files import STATUS_FAILED, STATUS_SUCCESS, write_status
from marin.serve.app import create_app

# Chinchilla's law, with a floor raised to suit small models; N_opt is about 6e6 params at 3e15 FLOPs,
# 1e7 at 1e16 and 1.7e7 at 3e16, so the five sizes bracket every budget's best.
E, A, B, ALPHA, BETA = 1.8, 406.4, 410.7, 0.34, 0.28
BUDGETS = (3e15, 1e16, 3e16)
SIZES = {"n2m": 2e6, "n5m": 5e6, "n10m": 1e7, "n20m": 2e7, "n50m": 5e7}
SWEEP = "sweeps/s"


def law(params: float, tokens: float) -> float:
    return E + A / params**ALPHA + B / tokens**BETA


def _budget_label(budget: float) -> str:
    mantissa, exponent = f"{budget:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def write_run(prefix: Path, budget: float, model: str, params: float, *, losses: dict[str, float] | None = None,
              status: str = STATUS_SUCCESS, artifact: str | None = None) -> str:
    """A finished train step folder as ``isoflop_sweep`` names it; returns its step name."""
    name = f"{SWEEP}/{_budget_label(budget)}/{model}"
    identity = hashlib.sha256(name.encode()).hexdigest()
    folder = prefix / f"{name}-{identity[:8]}"
    folder.mkdir(parents=True)
    (folder / ".executor_info").write_text(json.dumps({
        "name": name, "identity": identity, "version": "v1", "hash_attrs": {}, "deps": [],
        "annotations": {"sweep": {"budget": budget, "params": params}}}))
    tokens = budget / (6 * params)
    if artifact is None:
        artifact = json.dumps({"result_type": "marin.experiment.train:TrainedModel", "result": {
            "parameters": params, "tokens_trained": tokens, "flops_per_token": 6 * params,
            "validation_losses": losses if losses is not None else {"valid": law(params, tokens)}}})
    (folder / ".artifact.json").write_text(artifact)
    write_status(str(folder), status)
    return name


def write_sweep(prefix: Path, budgets=BUDGETS) -> list[str]:
    return [write_run(prefix, budget, model, params) for budget in budgets for model, params in SIZES.items()]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("scaling") / "prefix"
    names = write_sweep(prefix)
    # Beside the sweep: an unfinished run, and one whose only validation set has a name made to be HTML.
    unfinished = write_run(prefix, 1e17, "n50m", 5e7, status=STATUS_FAILED)
    odd = write_run(prefix, 1e16, "odd", 8e6, losses={"<script>alert(1)</script>": law(8e6, 1e16 / (6 * 8e6))})
    return {"prefix": str(prefix), "names": names, "unfinished": unfinished, "odd": odd,
            "client": TestClient(create_app(str(prefix)), raise_server_exceptions=False)}


def _svg(html: str, chart_id: str) -> str:
    match = re.search(rf'<figure class="chart" id="{chart_id}".*?</figure>', html, re.S)
    assert match, f"no chart {chart_id}"
    return match.group(0)


def test_page_draws_every_run_linked_to_its_step_and_a_parabola_per_budget(sweep):
    client = sweep["client"]
    started = time.perf_counter()
    response = client.get("/scaling")
    print(f"/scaling on {len(sweep['names']) + 1} runs answered in {time.perf_counter() - started:.2f} s")
    assert response.status_code == 200
    html = response.text
    used = set(sweep["names"])  # the odd run's loss is on another validation set: refused, not fitted
    steps = {row["name"]: row["path"] for row in client.get("/api/steps").json()["steps"]}
    step_pages = {"/step?" + urlencode({"path": steps[name]}) for name in used}
    for chart in ("loss-flops", "loss-params"):
        drawn = re.findall(r'<a href="([^"]+)"><circle class="run" data-run="([^"]+)"', _svg(html, chart))
        assert sorted(name for _, name in drawn) == sorted(used)
        assert {unescape(href) for href, _ in drawn} == step_pages
    parabolas = re.findall(r'<polyline class="parabola" data-points="(\d+)" data-budget="([^"]+)"', _svg(html, "loss-params"))
    assert sorted(float(budget) for _, budget in parabolas) == list(BUDGETS)
    assert all(int(points) > 10 for points, _ in parabolas)
    assert len(re.findall(r'<path class="vertex"', html)) == len(BUDGETS)
    frontier = re.search(r'<polyline class="frontier" data-points="(\d+)" data-source="parametric fit"', html)
    assert frontier and int(frontier.group(1)) > 10
    listed = re.findall(r'<tr data-run="([^"]+)"><td><a href="([^"]+)">', html)  # the table of runs used
    assert sorted(name for name, _ in listed) == sorted(used)
    assert {unescape(href) for _, href in listed} == step_pages
    assert 'href="/scaling"' in html  # in the navigation


def test_fitted_values_in_the_tables_are_the_analysis_own(sweep):
    client = sweep["client"]
    html = client.get("/scaling").text
    data = client.get("/api/scaling").json()
    isoflop, parametric = data["isoflop"], data["parametric"]

    def cell(cell_id: str) -> float:
        match = re.search(rf'id="{cell_id}" data-value="([^"]+)"', html)
        assert match, cell_id
        return float(match.group(1))

    assert cell("isoflop-params-exponent") == isoflop["params_opt"]["exponent"]["value"]
    assert cell("isoflop-tokens-exponent") == isoflop["tokens_opt"]["exponent"]["value"]
    for name in ("E", "A", "B", "alpha", "beta"):
        assert cell(f"parametric-{name}") == parametric[name]["value"]
    assert cell("parametric-params-exponent") == parametric["params_exponent"]["value"]
    # The law the runs were made from: its allocation exponent beta/(alpha+beta) is recovered by both fits.
    assert isoflop["params_opt"]["exponent"]["value"] == pytest.approx(BETA / (ALPHA + BETA), abs=0.05)
    assert parametric["params_exponent"]["value"] == pytest.approx(BETA / (ALPHA + BETA), abs=0.05)
    exponent = isoflop["params_opt"]["exponent"]
    assert f"{exponent['value']:.3g} [{exponent['low']:.3g}, {exponent['high']:.3g}]" in html
    # The compute-optimal allocation at the largest budget and 10x, 100x it.
    assert [row["flops"] for row in data["optimal"]] == [3e16, 3e17, 3e18]
    assert len(re.findall(r'<tr data-flops=', html)) == 3


def test_api_lists_runs_skipped_runs_and_both_fits(sweep):
    data = sweep["client"].get("/api/scaling").json()
    assert len(data["runs"]) == len(sweep["names"])
    assert data["isoflop"] is not None and data["parametric"] is not None
    assert data["isoflop_error"] is None and data["parametric_error"] is None
    assert [len(curve["runs"]) for curve in data["isoflop"]["curves"]] == [5, 5, 5]
    reasons = {skip["name"]: skip["reason"] for skip in data["skipped"]}
    assert set(reasons) == {sweep["unfinished"], sweep["odd"]}
    # Its loss is read on another validation set than the sweep's: it would measure something else.
    assert reasons[sweep["odd"]].startswith("differs from the 15 run(s) fitted in more than size and budget: "
                                            'validation set ("<script>alert(1)</script>", theirs "valid")')


def test_steps_glob_chooses_the_runs_fitted(sweep):
    client = sweep["client"]
    data = client.get("/api/scaling", params={"steps": f"{SWEEP}/1e16/n*"}).json()
    assert sorted(run["name"] for run in data["runs"]) == sorted(n for n in sweep["names"] if "/1e16/" in n)
    assert data["isoflop"] is None and "at least 2 budgets" in data["isoflop_error"]
    html = client.get("/scaling", params={"steps": f"{SWEEP}/1e16/n*"}).text
    assert len(re.findall(r'<circle class="run"', _svg(html, "loss-flops"))) == len(SIZES)
    assert f'value="{SWEEP}/1e16/n*"' in html  # the form keeps the glob


def test_a_skipped_runs_reason_is_escaped(sweep):
    client = sweep["client"]
    response = client.get("/scaling", params={"validation": "valid"})
    assert response.status_code == 200
    html = response.text
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    skipped = re.search(rf'<tr data-skipped="{re.escape(sweep["odd"])}">(.*?)</tr>', html, re.S)
    assert skipped and "no validation loss for &#x27;valid&#x27;" in skipped.group(1)
    data = client.get("/api/scaling", params={"validation": "valid"}).json()
    assert len(data["runs"]) == len(sweep["names"])


def test_one_budget_shows_why_there_is_no_isoflop_fit(tmp_path):
    names = write_sweep(tmp_path, budgets=(1e16,))
    client = TestClient(create_app(str(tmp_path)), raise_server_exceptions=False)
    response = client.get("/scaling")
    assert response.status_code == 200
    html = response.text
    assert 'id="isoflop-error"' in html and "at least 2 budgets" in html
    assert 'id="parametric"' in html or 'id="parametric-error"' in html
    assert len(re.findall(r'<circle class="run"', _svg(html, "loss-flops"))) == len(names)
    assert '<polyline class="parabola"' not in html


def test_a_damaged_artifact_is_listed_not_fitted(tmp_path):
    names = write_sweep(tmp_path)
    broken = write_run(tmp_path, 1e16, "broken", 3e6, artifact='{"result_type": <oops>')
    client = TestClient(create_app(str(tmp_path)), raise_server_exceptions=False)
    data = client.get("/api/scaling").json()
    assert len(data["runs"]) == len(names)
    assert [skip["name"] for skip in data["skipped"]] == [broken]
    assert "is damaged" in data["skipped"][0]["reason"]
    html = client.get("/scaling").text
    assert re.search(rf'<tr data-skipped="{re.escape(broken)}"><td><a href="/step\?path=', html)


def test_an_empty_prefix_says_how_to_make_a_sweep(tmp_path):
    client = TestClient(create_app(str(tmp_path)), raise_server_exceptions=False)
    response = client.get("/scaling")
    assert response.status_code == 200
    assert 'id="empty-state"' in response.text
    assert "marin run experiments/tutorials/isoflop_sweep.py" in response.text
    assert "<svg" not in response.text
    data = client.get("/api/scaling").json()
    assert data["runs"] == [] and data["isoflop"] is None and data["parametric"] is None
    assert data["isoflop_error"] and data["parametric_error"]


def test_a_sweep_that_cannot_tell_the_best_size_shows_what_is_not_identified_and_no_optimum(tmp_path):
    # Loss does not depend on size: the page marks the size term's values and gives no optimum for them.
    for budget in BUDGETS:
        for model, params in SIZES.items():
            write_run(tmp_path, budget, model, params, losses={"valid": 2 + 300 / (budget / (6 * params)) ** 0.3})
    client = TestClient(create_app(str(tmp_path)), raise_server_exceptions=False)
    html = client.get("/scaling").text
    data = client.get("/api/scaling").json()
    marked = re.findall(r'<td class="unidentified" data-for="parametric-(\w+)">not identified: ([^<]+)</td>', html)
    assert {name for name, _ in marked} >= {"A", "alpha"}
    assert unescape(dict(marked)["alpha"]) == data["parametric"]["alpha"]["unidentified"]
    cells = re.findall(r'<tr data-flops="[^"]+">(.*?)</tr>', html, re.S)
    assert len(cells) == 3 and all("not identified: A and alpha:" in unescape(cell) for cell in cells)
    assert all("unidentified" in row["parametric"] and "params" not in row["parametric"] for row in data["optimal"])
    # No frontier is drawn from a law whose optimum is not known.
    assert 'data-source="parametric fit"' not in html


def test_an_optimum_beyond_the_largest_budget_says_so_on_the_page(sweep):
    html = sweep["client"].get("/scaling").text
    rows = dict(re.findall(r'<tr data-flops="([^"]+)">(.*?)</tr>', html, re.S))
    assert "beyond the largest budget" not in rows[repr(3e16)]
    assert re.search(r"10× beyond the largest budget fitted, its interval a factor of [\d.]+ wide", rows[repr(3e17)])
    assert "100× beyond the largest budget fitted" in rows[repr(3e18)]
