"""The chat page of ``marin serve-model`` in a real headless Chromium: a message in, the reply streamed back.

As in test_serve_browser.py, Selenium drives Debian's chromium through its chromedriver
(``scripts/install_browser.sh``); without them the test skips and says why. The server runs in a
thread on a free port of 127.0.0.1.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time

import jax
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
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer  # noqa: E402
from marin.model_server.app import create_app  # noqa: E402
from marin.model_server.cli import build_server  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT_S = 30
NAME = "checkpoints/tiny-chat"


@pytest.fixture(scope="module")
def served(tmp_path_factory, synthetic_stories):
    import uvicorn

    folder = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:50], 400), folder)
    tokenizer = load_tokenizer(folder)
    config = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=128)
    server = build_server(config.build(tokenizer.vocab_size, key=jax.random.PRNGKey(0)), tokenizer, NAME,
                          chat_template="chatml", max_batch=4, block_size=16)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    instance = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=port, log_level="warning"))
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
    server.engine.close()


def _replies(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".message.assistant, .message.error")


def test_a_message_typed_in_the_page_gets_the_models_streamed_reply(served, browser, tmp_path):
    import httpx

    browser.get(served + "/")
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-mode") == "chat"
    browser.execute_script("document.getElementById('temperature').value = '0';"
                           "document.getElementById('max-tokens').value = '6';")
    browser.find_element(By.ID, "prompt").send_keys("Where did the cat go?")
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, WAIT_S).until(lambda d: _replies(d) and _replies(d)[-1].get_attribute("data-done") is not None)
    (reply,) = _replies(browser)
    browser.save_screenshot(str(tmp_path / "chat.png"))
    assert reply.get_attribute("data-done") == "true" and reply.get_attribute("data-finish") in ("stop", "length")
    # What the page assembled from the stream is what the API answers without streaming.
    expected = httpx.post(served + "/v1/chat/completions", timeout=WAIT_S, json={
        "model": NAME, "temperature": 0, "max_tokens": 6, "messages": [{"role": "user", "content": "Where did the cat go?"}],
    }).json()["choices"][0]["message"]["content"]
    assert reply.text == expected.strip() and expected.strip()
    user = browser.find_element(By.CSS_SELECTOR, ".message.user")
    assert user.text == "Where did the cat go?"

    # A refused request shows OpenAI's error message in the page instead of a reply.
    browser.execute_script("document.getElementById('max-tokens').value = '100000';")
    browser.find_element(By.ID, "prompt").send_keys("again")
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, WAIT_S).until(lambda d: len(_replies(d)) == 2 and _replies(d)[-1].get_attribute("data-done"))
    error = _replies(browser)[-1]
    assert error.get_attribute("data-done") == "error" and "context is 128 tokens" in error.text
