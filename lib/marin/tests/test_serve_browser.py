"""``marin serve`` in a real headless Chromium, over a prefix made by a tiny training run.

The server runs in a thread on a free port of 127.0.0.1; Selenium drives Debian's chromium through
its chromedriver (``scripts/install_browser.sh``, run by ``make test``, installs both). Without
them the tests skip and say why. Each test saves a screenshot of its page in the test's folder;
``MARIN_UPDATE_SCREENSHOTS=1`` also writes them to ``docs/images/`` for docs/browser.md.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
webdriver = pytest.importorskip("selenium.webdriver", reason="the browser tests need `pip install selenium` (test extra)")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("no chromium/chromedriver on this machine: run scripts/install_browser.sh (make test does)",
                allow_module_level=True)

from levanter.models.llama import LlamaConfig  # noqa: E402
from levanter.optim import AdamConfig  # noqa: E402
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer  # noqa: E402
from marin.execution.step_runner import StepRunner  # noqa: E402
from marin.experiment.data import tokenized  # noqa: E402
from marin.experiment.train import train_lm  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

STEPS = 6
WAIT_S = 30
DOCS_IMAGES = Path(__file__).resolve().parents[3] / "docs" / "images"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, synthetic_stories):
    """A prefix holding a tokenize step and a 6-step training run, as a user's first run leaves it."""
    root = tmp_path_factory.mktemp("browser")
    (root / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in synthetic_stories[:120]))
    (root / "validation.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in synthetic_stories[300:320]))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:120], 400), str(root / "tokenizer"))
    data = tokenized("tokenized/stories", str(root / "train.jsonl"), str(root / "tokenizer"),
                     validation=str(root / "validation.jsonl"))
    def model(learning_rate: float):
        return train_lm(
            name="checkpoints/tiny",
            model=LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64),
            optimizer=AdamConfig(learning_rate=learning_rate),
            datasets={data: 1.0},
            batch_size=8,  # the suite runs on 8 host devices, and each gets a row
            seq_len=64,
            num_train_steps=STEPS,
            num_samples=1,
        )

    prefix = str(root / "prefix")
    runner = StepRunner(prefix=prefix)
    first, second = model(3e-3), model(1e-2)  # two runs of one step name, as when trying a learning rate
    runner.run([first])
    runner.run([second])
    return prefix, runner.output_path_for(first), runner.output_path_for(data), runner.output_path_for(second)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_run):
    import uvicorn

    from marin.serve.app import create_app

    prefix = tiny_run[0]
    port = _free_port()
    config = uvicorn.Config(create_app(prefix), host="127.0.0.1", port=port, log_level="warning")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not instance.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail(f"the server did not start on 127.0.0.1:{port} within {WAIT_S} s")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    instance.should_exit = True
    thread.join(timeout=WAIT_S)


def _screenshot(driver, tmp_path: Path, name: str) -> None:
    driver.save_screenshot(str(tmp_path / f"{name}.png"))
    if os.environ.get("MARIN_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(DOCS_IMAGES / f"serve-{name}.png"))


def _wait(driver, condition):
    return WebDriverWait(driver, WAIT_S).until(condition)


def _relative(tiny_run, index: int) -> str:
    return os.path.relpath(tiny_run[index], tiny_run[0]).replace("/", "%2F")


def test_step_list_then_the_training_step_then_its_loss_chart(server, browser, tiny_run, tmp_path):
    browser.get(server + "/")
    rows = _wait(browser, expected_conditions.presence_of_all_elements_located((By.CSS_SELECTOR, "tr[data-name]")))
    names = [row.get_attribute("data-name") for row in rows]
    assert "checkpoints/tiny" in names and "tokenized/stories" in names
    _screenshot(browser, tmp_path, "steps")

    # The page's own script: typing in the filter box hides the rows that do not match.
    browser.find_element(By.ID, "filter").send_keys("tokenized")
    _wait(browser, lambda driver: not any(row.is_displayed() for row in driver.find_elements(
        By.CSS_SELECTOR, 'tr[data-name="checkpoints/tiny"]')))
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-name="tokenized/stories"]').is_displayed()
    browser.find_element(By.ID, "filter").clear()
    browser.get(server + "/")
    _wait(browser, expected_conditions.presence_of_all_elements_located((By.CSS_SELECTOR, "tr[data-name]")))

    browser.find_element(By.CSS_SELECTOR, f'a[href="/step?path={_relative(tiny_run, 1)}"]').click()
    _wait(browser, expected_conditions.presence_of_element_located((By.ID, "hash-attrs")))
    assert "num_train_steps" in browser.find_element(By.ID, "hash-attrs").text
    _screenshot(browser, tmp_path, "step")

    browser.find_element(By.ID, "training-curves").click()
    charts = _wait(browser, expected_conditions.presence_of_all_elements_located((By.CSS_SELECTOR, "figure.chart")))
    loss_chart = next(chart for chart in charts if chart.find_element(By.TAG_NAME, "figcaption").text == "loss")
    (loss,) = loss_chart.find_elements(By.CSS_SELECTOR, "polyline[data-series]")  # one run selected: one line
    # One point per training step, as the browser drew it (the points attribute, not the server's count).
    assert len(loss.get_attribute("points").split()) == STEPS
    assert loss.is_displayed()
    _screenshot(browser, tmp_path, "training")


def test_the_data_browser_decodes_the_token_cache(server, browser, tiny_run, tmp_path):
    prefix, _, tokenize_output, _ = tiny_run
    cache = os.path.relpath(os.path.join(tokenize_output, "train"), prefix)
    browser.get(f"{server}/data?path={cache}&count=2")
    # Both documents: the page may still be arriving when the first one is there (a loaded machine).
    blocks = _wait(browser, lambda driver: found if len(found := driver.find_elements(By.CSS_SELECTOR, "div.tok")) >= 2 else False)
    text = blocks[0].text
    assert len(blocks) == 2 and len(text.split()) > 10
    # Token boundaries are visible: one span per token, alternating backgrounds.
    spans = blocks[0].find_elements(By.TAG_NAME, "span")
    assert len(spans) == int(blocks[0].get_attribute("data-tokens")) > 10
    assert spans[0].value_of_css_property("background-color") != spans[1].value_of_css_property("background-color")
    _screenshot(browser, tmp_path, "data")


def test_the_step_page_lists_attempts_and_a_running_log_follows(server, browser, tiny_run, tmp_path):
    from iris.attempt_log import AttemptLog, AttemptOutcome

    prefix, _, tokenize_output, _ = tiny_run
    attempt = AttemptLog.begin(tokenize_output, engine="slurm", job_id="tokenize-job-1", job_attempt=1)
    attempt.append(0, b"hello from the first line\n")
    browser.get(f"{server}/step?path={os.path.relpath(tokenize_output, prefix)}")
    row = _wait(browser, expected_conditions.presence_of_element_located(
        (By.CSS_SELECTOR, f'#attempts tr[data-attempt="{attempt.attempt}"]')))
    assert row.get_attribute("data-outcome") == "RUNNING" and "tokenize-job-1" in row.text
    _screenshot(browser, tmp_path, "attempts")

    row.find_element(By.CSS_SELECTOR, "a.log-link").click()
    log = _wait(browser, expected_conditions.presence_of_element_located((By.ID, "log")))
    assert log.text == "hello from the first line"
    # The page's script follows the running attempt: new output appears without a reload.
    attempt.append(0, b"a line written after the page opened\n")
    _wait(browser, lambda driver: "a line written after the page opened" in driver.find_element(By.ID, "log").text)
    attempt.finish(AttemptOutcome.SUCCEEDED, "", [0])
    _wait(browser, lambda driver: "SUCCEEDED" in driver.find_element(By.ID, "follow-state").text)
    assert not browser.find_element(By.ID, "follow").is_selected()
    assert "SUCCEEDED (exit 0)" in browser.find_element(By.ID, "attempt-line").text
    assert browser.find_element(By.ID, "window-end").text == browser.find_element(By.ID, "window-size").text == "63"
    _screenshot(browser, tmp_path, "log")


def _losses(run_folder: str) -> list[float]:
    with open(os.path.join(run_folder, "metrics.jsonl")) as handle:
        return [record["loss"] for record in map(json.loads, handle) if "loss" in record]


def _hover_step(driver, chart, step: int) -> None:
    """Moves the pointer over ``step`` on the chart, through the scale the server wrote into the SVG."""
    from selenium.webdriver.common.action_chains import ActionChains

    svg = chart.find_element(By.CSS_SELECTOR, "svg.chart")
    scale = {key: float(svg.get_attribute(f"data-{key}")) for key in ("x-lo", "x-hi", "left", "plot-w", "top", "plot-h")}
    view_x = scale["left"] + (step - scale["x-lo"]) / (scale["x-hi"] - scale["x-lo"]) * scale["plot-w"]
    width = svg.size["width"]
    view_width = float(svg.get_dom_attribute("viewBox").split()[2])
    offset_x = (view_x - view_width / 2) * width / view_width  # Selenium offsets are from the element's centre
    ActionChains(driver).move_to_element_with_offset(svg, round(offset_x), 0).perform()


def _loss_chart(driver):
    charts = _wait(driver, expected_conditions.presence_of_all_elements_located((By.CSS_SELECTOR, "figure.chart")))
    return next(chart for chart in charts if chart.get_attribute("data-title") == "loss")


def test_hovering_a_chart_reads_out_step_value_and_run(server, browser, tiny_run, tmp_path):
    browser.get(f"{server}/runs?run={_relative(tiny_run, 1)}")
    chart = _loss_chart(browser)
    _hover_step(browser, chart, 3)
    readout = chart.find_element(By.CLASS_NAME, "readout")
    _wait(browser, lambda driver: readout.text.startswith("step 3"))
    (row,) = readout.find_elements(By.CSS_SELECTOR, ".row")
    assert row.get_attribute("data-series").startswith("checkpoints/tiny ")
    assert float(row.get_attribute("data-value")) == _losses(tiny_run[1])[2]  # the value logged, not read off pixels
    sample = browser.find_element(By.CSS_SELECTOR, "pre.sample")  # samples wrap instead of scrolling sideways
    assert sample.value_of_css_property("white-space") == "pre-wrap"
    _screenshot(browser, tmp_path, "hover")


def test_the_smoothing_slider_redraws_with_the_servers_smoothing(server, browser, tiny_run, tmp_path):
    from marin.serve.charts import smooth

    browser.get(f"{server}/runs?run={_relative(tiny_run, 1)}")
    chart = _loss_chart(browser)
    line = chart.find_element(By.CSS_SELECTOR, "polyline.series")
    before = line.get_attribute("points")
    slider = browser.find_element(By.ID, "smoothing")
    browser.execute_script("arguments[0].value = '0.6'; arguments[0].dispatchEvent(new Event('input'));", slider)
    assert browser.find_element(By.ID, "smoothing-value").text == "0.60"
    after = line.get_attribute("points")
    assert after != before and len(after.split()) == STEPS
    assert chart.find_element(By.CSS_SELECTOR, "polyline.raw").get_attribute("display") is None  # raw line behind
    _hover_step(browser, chart, 4)
    readout = chart.find_element(By.CLASS_NAME, "readout")
    _wait(browser, lambda driver: readout.text.startswith("step 4"))
    shown = float(readout.find_element(By.CSS_SELECTOR, ".row").get_attribute("data-value"))
    # The script's smoothing agrees with the server's to rounding: both are the same sum in doubles.
    assert shown == pytest.approx(smooth(_losses(tiny_run[1]), 0.6)[3], rel=1e-12)
    assert "raw" in readout.text


def test_the_comparison_table_shows_what_differs_and_sorts(server, browser, tiny_run, tmp_path):
    browser.get(server + "/runs")  # opens on the newest runs: both are selected
    table = _wait(browser, expected_conditions.presence_of_element_located((By.ID, "comparison")))
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 2
    # What the runs were trained with comes first: the one thing changed between them is the peak rate.
    headings = [th.get_attribute("data-key") for th in table.find_elements(By.CSS_SELECTOR, "th[data-key]")]
    assert headings[:2] == ["optimizer", "peak learning rate"] and not table.find_elements(By.CSS_SELECTOR, "th.setting")
    rate_column, loss_column = headings.index("peak learning rate") + 1, headings.index("loss") + 1
    rates = sorted(tr.find_elements(By.TAG_NAME, "td")[rate_column].text for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr"))
    assert rates == ["0.003", "0.01"]  # the peaks, not the rates the schedule decayed them to
    # The table fits the page: nothing to scroll sideways in a 1280-pixel window.
    assert browser.execute_script("return document.documentElement.scrollWidth") <= browser.execute_script(
        "return window.innerWidth")

    def losses():
        return [float(tr.find_elements(By.TAG_NAME, "td")[loss_column].get_attribute("data-sort"))
                for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")]

    finals = sorted(_losses(tiny_run[1])[-1:] + _losses(tiny_run[3])[-1:])
    table.find_element(By.CSS_SELECTOR, 'th[data-key="loss"]').click()
    assert losses() == finals
    table.find_element(By.CSS_SELECTOR, 'th[data-key="loss"]').click()
    assert losses() == finals[::-1]
    _hover_step(browser, _loss_chart(browser), STEPS)
    _screenshot(browser, tmp_path, "training")


def test_dragging_across_a_chart_zooms_and_a_double_click_zooms_out(server, browser, tiny_run, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    browser.get(f"{server}/runs?run={_relative(tiny_run, 1)}&smooth=0.3")
    _hover_step(browser, _loss_chart(browser), 2)
    svg = _loss_chart(browser).find_element(By.CSS_SELECTOR, "svg.chart")
    width, view_width = svg.size["width"], float(svg.get_dom_attribute("viewBox").split()[2])
    plot_w = float(svg.get_attribute("data-plot-w"))
    three_steps = 3 / (STEPS - 1) * plot_w * width / view_width  # pixels from step 2 to step 5
    ActionChains(browser).click_and_hold().move_by_offset(round(three_steps), 0).release().perform()
    _wait(browser, lambda driver: "xmin=" in driver.current_url)
    line = _loss_chart(browser).find_element(By.CSS_SELECTOR, "polyline.series")
    steps = [x for x, _ in json.loads(line.get_attribute("data-values"))]
    assert {3, 4} <= set(steps) <= {2, 3, 4, 5}  # the dragged range, to a pixel either side
    assert browser.find_element(By.ID, "reset-zoom").is_displayed()
    assert browser.find_element(By.ID, "smoothing").get_attribute("value") == "0.3"  # zooming keeps the smoothing
    ActionChains(browser).double_click(_loss_chart(browser).find_element(By.CSS_SELECTOR, "svg.chart")).perform()
    _wait(browser, lambda driver: "xmin=" not in driver.current_url)
    line = _loss_chart(browser).find_element(By.CSS_SELECTOR, "polyline.series")
    assert int(line.get_attribute("data-points")) == STEPS
