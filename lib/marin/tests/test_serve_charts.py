"""The runs page's charts and comparison, on a prefix of two hand-made training runs of one step name."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient
from marin.serve.app import create_app
from marin.serve.charts import LEFT, RIGHT, WIDTH, Axes, tick_label, log_ticks, ticks, line_chart, short_label, smooth
from marin.serve.runs import by_tokens

STEPS = 10
TOKENS_PER_STEP = 512


def _run(prefix: Path, short: str, lr: float, finished: float, loss_start: float, *, batch_size: int = 4,
         **optimizer: object) -> str:
    folder = prefix / "checkpoints" / f"tiny-{short}"
    folder.mkdir(parents=True)
    (folder / ".executor_info").write_text(json.dumps({
        "name": "checkpoints/tiny", "identity": short + "0" * 56, "version": "v1",
        "hash_attrs": {"optimizer": {"type": "adam", "learning_rate": lr, "weight_decay": 0.1, **optimizer},
                       "batch_size": batch_size},
        "deps": [{"name": "tokenized/stories", "identity": "ab" * 32}]}))
    (folder / ".executor_status").write_text(json.dumps({"status": "SUCCESS", "time": finished}))
    with open(folder / "metrics.jsonl", "w") as handle:
        for step in range(1, STEPS + 1):
            record = {"step": step, "loss": loss_start - 0.25 * step, "lr": lr, "tokens": step * TOKENS_PER_STEP}
            if step == STEPS:
                record["eval/stories/loss"] = loss_start - 2.0
            handle.write(json.dumps(record) + "\n")
    return f"checkpoints/tiny-{short}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("charts") / "prefix"
    older = _run(prefix, "11111111", 6e-4, 1.0e9, 5.0)
    newer = _run(prefix, "22222222", 6e-3, 2.0e9, 4.0)
    return TestClient(create_app(str(prefix))), older, newer


def _drawn(page: str) -> dict[str, list[list[float]]]:
    """The loss chart's series (the first chart), as the page hands them to its script."""
    loss = page.split('data-title="validation loss"')[0]
    return {unescape(name): json.loads(unescape(values)) for name, values in
            re.findall(r'data-series="([^"]+)" data-points="\d+" data-colour="[^"]+" data-values="([^"]+)"', loss)}


def test_smoothing_removes_the_start_up_bias():
    assert smooth([4.0, 0.0, 0.0], 0.0) == [4.0, 0.0, 0.0]
    # weight 0.5: averages 2, 1, 0.5 divided by 1 - 0.5**n = 0.5, 0.75, 0.875
    assert smooth([4.0, 0.0, 0.0], 0.5) == pytest.approx([4.0, 4 / 3, 4 / 7])
    assert smooth([3.0] * 5, 0.9) == pytest.approx([3.0] * 5)  # a constant stays itself


def test_tick_labels_never_repeat():
    for lo, hi in ((99, 101), (2.6, 2.75), (0, 1.2e6), (0.0011, 0.0014), (1, 7)):
        placed = ticks(lo, hi)
        labels = [tick_label(t, placed[1] - placed[0]) for t in placed]
        assert len(set(labels)) == len(labels) >= 2, (lo, hi, labels)
    assert ticks(99, 101, integer=True) == [99, 100, 101]
    assert [round(10**t, 6) for t in log_ticks(-2, 1)] == [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10]


def test_a_single_point_chart_has_one_x_tick_under_the_point():
    svg = line_chart("validation loss", {"run": [(100, 2.737)]}, Axes(y_title="validation loss"))
    x_labels = re.findall(r'text-anchor="middle" class="tick">([^<]+)<', svg)
    assert x_labels == ["100"]
    y_labels = re.findall(r'text-anchor="end" class="tick">([^<]+)<', svg)
    assert len(set(y_labels)) == len(y_labels) >= 2
    assert '<circle' in svg and ">step</text>" in svg and ">validation loss</text>" in svg


def test_runs_page_opens_on_the_newest_run_first(runs):
    client, older, newer = runs
    page = client.get("/runs").text
    checked = re.findall(r'value="([^"]+)" checked', page)
    assert checked == [newer, older]  # both selected (fewer than the default count), newest first
    assert page.index(newer) < page.index(older)


def test_step_list_marks_no_newest_between_outputs_of_other_settings(runs):
    client, older, newer = runs
    # Two learning rates under one name: two experiments, neither newer nor older than the other.
    marks = {s["path"]: s["newest"] for s in client.get("/api/steps").json()["steps"]}
    assert marks == {newer: None, older: None}
    assert '<span class="newest">' not in client.get("/").text.split("<script>")[0]


def test_step_list_marks_the_newest_rerun_of_one_configuration(tmp_path):
    first = _run(tmp_path, "11111111", 6e-4, 1.0e9, 5.0)
    again = _run(tmp_path, "22222222", 6e-4, 2.0e9, 4.0)  # the same settings, run again (another version or data)
    other = _run(tmp_path, "33333333", 6e-3, 3.0e9, 4.0)
    marks = {s["path"]: s["newest"] for s in TestClient(create_app(str(tmp_path))).get("/api/steps").json()["steps"]}
    assert marks == {again: True, first: False, other: None}


def test_x_by_tokens_log_y_and_zoom_redraw_on_the_server(runs):
    client, older, newer = runs
    by_step = _drawn(client.get("/runs", params={"run": newer}).text)
    assert by_step["checkpoints/tiny 22222222"][0] == [1, 3.75]
    by_tokens = _drawn(client.get("/runs", params={"run": newer, "x": "tokens"}).text)
    assert by_tokens["checkpoints/tiny 22222222"][0] == [TOKENS_PER_STEP, 3.75]
    log_page = client.get("/runs", params={"run": newer, "y": "log"}).text
    assert "training loss (log)" in log_page and 'data-log="1"' in log_page
    zoomed = _drawn(client.get("/runs", params={"run": newer, "xmin": 3, "xmax": 6}).text)
    assert [x for x, _ in zoomed["checkpoints/tiny 22222222"]] == [3, 4, 5, 6]


def test_comparison_names_the_optimizer_and_peak_rate_first_then_what_differs_then_the_metrics(runs):
    client, older, newer = runs
    table = client.get("/api/compare", params={"run": [older, newer]}).json()
    # The learning rate differs, but it is already in the leading columns; batch size, decay, data: the same.
    assert table["settings"] == []
    assert table["values"][older]["optimizer"] == "adam" and table["values"][older]["peak learning rate"] == "0.0006"
    assert table["values"][newer]["peak learning rate"] == "0.006"
    assert table["values"][older]["loss"] == pytest.approx(5.0 - 0.25 * STEPS)
    assert table["values"][newer]["stories loss"] == pytest.approx(2.0)
    assert "learning rate" not in table["metrics"]  # the peak is shown once, in front
    page = client.get("/runs", params={"run": [older, newer]}).text
    comparison = page.split('id="comparison"')[1].split("</table>")[0]
    headings = re.findall(r'<th data-key="([^"]+)"', comparison)
    assert headings[:3] == ["optimizer", "peak learning rate", "steps"]  # no settings differ: the metrics follow
    assert '<p class="muted">no other settings differ between these runs</p>' in page  # the rate differs, in front
    assert "weight_decay" not in comparison


def test_differing_settings_come_before_the_metrics_the_optimizers_first(tmp_path):
    runs = [_run(tmp_path, "11111111", 6e-4, 1.0e9, 5.0),
            _run(tmp_path, "22222222", 2e-2, 2.0e9, 4.0, batch_size=8, type="muon", adam_learning_rate=3e-3, momentum=0.95)]
    client = TestClient(create_app(str(tmp_path)))
    table = client.get("/api/compare", params={"run": runs}).json()
    assert table["values"][runs[1]]["optimizer"] == "muon"
    assert table["values"][runs[1]]["peak learning rate"] == "0.02 (adam_learning_rate 0.003)"
    assert table["settings"] == ["hash_attrs.optimizer.momentum", "hash_attrs.batch_size"]
    comparison = client.get("/runs", params={"run": runs}).text.split('id="comparison"')[1].split("</table>")[0]
    headings = re.findall(r'<th data-key="([^"]+)"', comparison)
    assert headings[:4] == ["optimizer", "peak learning rate", "hash_attrs.optimizer.momentum", "hash_attrs.batch_size"]
    assert headings.index("hash_attrs.batch_size") < headings.index("loss")
    assert ">optimizer.momentum</th>" in comparison  # shown without the hash_attrs. prefix


def test_a_run_without_an_optimizer_record_shows_the_peak_of_its_logged_rate(tmp_path):
    from marin.serve.runs import final_metrics

    series = {"loss": [(1, 5.0), (2, 4.0), (3, 3.5)], "lr": [(1, 1e-3), (2, 3e-3), (3, 1e-5)]}
    assert final_metrics(series)["peak learning rate"] == 3e-3
    assert "learning rate" not in final_metrics(series)


def test_lineage_labels_are_cut_in_the_middle_so_versions_stay_apart():
    first, second = "checkpoints/marin-nano-tinystories 72472b56", "checkpoints/marin-nano-tinystories 0badc0de"
    assert short_label(first) != short_label(second)
    assert len(short_label(first)) == 30 and short_label(first).endswith("es 72472b56")
    assert short_label("data/raw 0123abcd") == "data/raw 0123abcd"


def test_x_by_tokens_interpolates_a_step_logged_without_a_count():
    series = {"tokens": [(2, 1000.0), (4, 2000.0)], "eval/x/loss": [(1, 9.0), (3, 5.0), (4, 4.0), (5, 3.0)]}
    # step 3 lies halfway between the counts at 2 and 4; steps 1 and 5 are outside them and left out
    assert by_tokens(series)["eval/x/loss"] == [(1500.0, 5.0), (2000.0, 4.0)]


def test_a_training_run_in_progress_shows_its_curve_from_its_staging_folder(tmp_path):
    from marin.serve.runs import run_metrics

    step = tmp_path / "checkpoints" / "live-ab12cd34"
    staged = step / ".staging-g3"
    staged.mkdir(parents=True)
    (step / ".executor_status").write_text(json.dumps({"status": "RUNNING", "time": 1.0, "generation": 3, "staging": ".staging-g3"}))
    (staged / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 5.0 - i}) + "\n" for i in (1, 2, 3)))
    assert run_metrics(str(tmp_path), "checkpoints/live-ab12cd34")["loss"] == [(1, 4.0), (2, 3.0), (3, 2.0)]
    # A record naming a folder outside the step's staging area is not followed.
    (step / ".executor_status").write_text(json.dumps({"status": "RUNNING", "time": 1.0, "staging": "../other"}))
    with pytest.raises(Exception, match="not a training run"):
        run_metrics(str(tmp_path), "checkpoints/live-ab12cd34")


def test_a_running_training_steps_page_links_its_curves(tmp_path):
    step = tmp_path / "checkpoints" / "live-ab12cd34"
    staged = step / ".staging" / "g3"  # as earlier versions named an execution's staging folder: still followed
    staged.mkdir(parents=True)
    (step / ".executor_info").write_text(json.dumps({"name": "checkpoints/live", "identity": "ab12cd34" + "0" * 56}))
    (step / ".executor_status").write_text(json.dumps({"status": "RUNNING", "time": 1.0, "generation": 3, "staging": ".staging/g3"}))
    (staged / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    page = TestClient(create_app(str(tmp_path))).get("/step", params={"path": "checkpoints/live-ab12cd34"}).text
    assert re.search(r'<a id="training-curves" href="/runs\?run=checkpoints%2Flive-ab12cd34">', page)


def test_charts_nothing_logged_are_named_in_one_line_not_drawn_as_empty_panels(runs):
    client, older, newer = runs
    page = client.get("/runs", params={"run": newer}).text
    titles = re.findall(r'<figure class="chart" data-title="([^"]+)"', page)
    assert titles == ["loss", "validation loss", "learning rate"]  # what these runs logged
    assert re.search(r'<p class="muted" id="not-logged">not logged by these runs: lm-eval-harness, tokens/s, MFU</p>', page)
    assert "no data" not in page


def test_the_first_and_last_points_stand_off_the_plots_border():
    svg = line_chart("validation loss", {"run": [(10, 3.0), (100, 2.5)]}, Axes(y_title="validation loss"))
    scale = dict(re.findall(r'data-(x-lo|x-hi)="([^"]+)"', svg))
    assert float(scale["x-lo"]) < 10 and float(scale["x-hi"]) > 100
    left, width = LEFT, WIDTH - LEFT - RIGHT
    xs = [float(x) for x in re.search(r'class="series"[^>]* points="([^"]+)"', svg).group(1).replace(",", " ").split()[::2]]
    assert left < xs[0] and xs[-1] < left + width
