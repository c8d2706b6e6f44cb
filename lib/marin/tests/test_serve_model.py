"""``marin serve-model`` driven by real clients: the ``openai`` package, lm-eval's ``local-completions``, curl-like HTTP,
and hostile ones: a huge body, a prompt too long to fit, text that is not Unicode, token ids outside the
vocabulary, 32 clients at once. Each is answered in OpenAI's error shape, and the server gives the
same greedy answers afterwards.

One server runs in a thread on a free port of 127.0.0.1 for the module, over a tiny random Llama
and a tokenizer trained on the built-in lm-eval task's text; every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jax
import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai", reason="the server tests drive it with the openai client (test extra)")

from levanter.inference import sample  # noqa: E402
from levanter.models.llama import LlamaConfig  # noqa: E402
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer  # noqa: E402
from marin.evaluation.tasks.object_colours import colours  # noqa: E402
from marin.model_server.app import ModelServer, create_app  # noqa: E402
from marin.model_server.cli import build_server  # noqa: E402
from marin.model_server.limits import MAX_BODY_BYTES  # noqa: E402

CONFIG = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=128)
NAME = "checkpoints/tiny-served"
PROMPT = "In story 3, the frog was"
WAIT_S = 60
END_OF_TURN = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(train_bpe_tokenizer(colours.training_text(), 300), folder)
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def model(tokenizer):
    return CONFIG.build(tokenizer.vocab_size, key=jax.random.PRNGKey(0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_in_thread(server: ModelServer):
    import uvicorn

    port = _free_port()
    instance = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not instance.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail(f"the server did not start on 127.0.0.1:{port} within {WAIT_S} s")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", instance, thread


@pytest.fixture(scope="module")
def served(model, tokenizer):
    server = build_server(model, tokenizer, NAME, chat_template="chatml", max_batch=16, block_size=8)
    url, instance, thread = _serve_in_thread(server)
    yield url, server
    instance.should_exit = True
    thread.join(timeout=WAIT_S)
    server.engine.close()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="not-needed", timeout=WAIT_S, max_retries=0)


def _greedy(model, tokenizer, ids: list[int], max_tokens: int, stop: str | None = None) -> str:
    """The reference: levanter's dense ``sample``, cut at EOS and at ``stop``."""
    out = np.asarray(sample(model, np.asarray(ids, np.int32), max_new_tokens=max_tokens, temperature=0.0,
                            eos_id=tokenizer.eos_id))[len(ids):].tolist()
    if tokenizer.eos_id in out:
        out = out[:out.index(tokenizer.eos_id)]
    text = tokenizer.tokenizer.decode(out, skip_special_tokens=True)
    return text[:text.index(stop)] if stop and stop in text else text


def _document(tokenizer, text: str) -> list[int]:
    return [tokenizer.eos_id, *tokenizer.tokenizer.encode(text, add_special_tokens=False).ids]


def test_models_lists_the_served_model(client):
    (listed,) = client.models.list().data
    assert listed.id == NAME and listed.owned_by == "marin"


def test_a_greedy_completion_is_what_sample_gives_and_streams_the_same(client, model, tokenizer):
    done = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0)
    expected = _greedy(model, tokenizer, _document(tokenizer, PROMPT), 6)
    (choice,) = done.choices
    assert choice.text == expected and choice.finish_reason == "length"
    assert done.usage.prompt_tokens == len(_document(tokenizer, PROMPT)) and done.usage.completion_tokens == 6

    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_a_stop_string_cuts_the_text_streamed_or_not(client, model, tokenizer):
    whole = _greedy(model, tokenizer, _document(tokenizer, PROMPT), 12)
    stop = whole[3:5]  # two characters from inside the continuation
    expected = whole[:whole.index(stop)]
    done = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop, "never appears"])
    assert done.choices[0].text == expected and done.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_a_batch_of_prompts_and_token_prompts_and_seeded_samples(client, model, tokenizer):
    prompts = [PROMPT, "In story 5, the sky was", "the"]
    batch = client.completions.create(model=NAME, prompt=prompts, max_tokens=4, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    for prompt, choice in zip(prompts, batch.choices):
        assert choice.text == _greedy(model, tokenizer, _document(tokenizer, prompt), 4)
    ids = tokenizer.tokenizer.encode(PROMPT, add_special_tokens=False).ids
    assert client.completions.create(model=NAME, prompt=ids, max_tokens=4, temperature=0).choices[0].text == batch.choices[0].text

    def draw(seed):
        return [c.text for c in client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=seed, n=2).choices]

    first = draw(7)
    assert len(first) == 2 and first == draw(7) and first != draw(8)


def test_echo_with_logprobs_scores_every_prompt_token(client, model, tokenizer):
    ids = tokenizer.tokenizer.encode(PROMPT, add_special_tokens=False).ids
    done = client.completions.create(model=NAME, prompt=ids, max_tokens=0, echo=True, logprobs=2, temperature=0)
    logprobs = done.choices[0].logprobs
    assert done.choices[0].text == tokenizer.tokenizer.decode(ids)
    assert len(logprobs.token_logprobs) == len(ids) == len(logprobs.tokens) == len(logprobs.top_logprobs)
    conditioned = [tokenizer.eos_id, *ids]
    expected = np.asarray(jax.nn.log_softmax(model(np.asarray([conditioned], np.int32))[0], axis=-1))
    for t, token in enumerate(ids):  # each given the document start and the tokens before it
        assert logprobs.token_logprobs[t] == pytest.approx(expected[t, token], abs=1e-4)
        assert len(logprobs.top_logprobs[t]) == 2 and max(logprobs.top_logprobs[t].values()) == pytest.approx(expected[t].max(), abs=1e-4)

    with_token = client.completions.create(model=NAME, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
    assert len(with_token.choices[0].logprobs.token_logprobs) == len(ids) + 1  # as lm-eval reads it


def test_chat_uses_the_template_and_ends_at_the_end_of_turn(client, model, tokenizer, served):
    messages = [{"role": "user", "content": "What colour is the sea?"}]
    rendered = served[1].renderer.render(messages, add_generation_prompt=True)
    ids = tokenizer.tokenizer.encode(rendered, add_special_tokens=False).ids
    expected = _greedy(model, tokenizer, ids, 8, stop=END_OF_TURN)
    done = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content == expected
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    scored = client.chat.completions.create(model=NAME, messages=messages, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    assert len(scored.choices[0].logprobs.content) == 3 and len(scored.choices[0].logprobs.content[0].top_logprobs) == 2


def test_chat_without_a_template_is_a_clear_400(model, tokenizer):
    from fastapi.testclient import TestClient
    from levanter.inference.engine import EngineConfig, GenerationEngine

    plain = ModelServer(GenerationEngine(model, EngineConfig(max_batch=1, block_size=8)), tokenizer, NAME, None)
    with TestClient(create_app(plain)) as http:
        answer = http.post("/v1/chat/completions", json={"model": NAME, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "no_chat_template" and "has no chat template" in error["message"] and "--chat-template" in error["message"]


def test_bad_requests_get_the_openai_error_shape_and_a_4xx(served, client):
    url = served[0]
    cases = [
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", {"model": NAME, "prompt": PROMPT, "temperature": 5}, 400, "temperature"),
        ("/v1/completions", {"model": NAME, "prompt": PROMPT, "n": 0}, 400, "n"),
        ("/v1/completions", {"model": NAME, "prompt": PROMPT, "frequency_penalty": 0.5}, 400, "frequency_penalty"),
        ("/v1/completions", {"model": NAME, "prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ("/v1/completions", {"model": NAME}, 400, "prompt"),
        ("/v1/completions", {"model": NAME, "prompt": [[1, 2], "text"]}, 400, "prompt"),
        ("/v1/completions", {"model": NAME, "prompt": [10**9]}, 400, "prompt"),
        ("/v1/completions", {"model": "gpt-4", "prompt": PROMPT}, 404, "model"),
        ("/v1/chat/completions", {"model": NAME, "messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0]"),
        ("/v1/nothing-here", {}, 404, None),
    ]
    with httpx.Client(timeout=WAIT_S) as http:
        for path, body, status, param in cases:
            answer = http.post(url + path, content=body) if isinstance(body, bytes) else http.post(url + path, json=body)
            assert answer.status_code == status, (path, body, answer.text)
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, (body, error)
            assert "Traceback" not in answer.text
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=NAME, prompt=PROMPT * 20, max_tokens=50)
    assert refused.value.code == "context_length_exceeded"
    assert re.search(r"context is 128 tokens, but the prompt has \d+ and max_tokens asks for 50 more", refused.value.message)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt=PROMPT)


def _metric(text: str, name: str) -> float:
    (value,) = re.findall(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(value)


def test_metrics_count_the_tokens_in_prometheus_text(served, client, tokenizer):
    with httpx.Client(timeout=WAIT_S) as http:
        before = http.get(served[0] + "/metrics").text
        client.completions.create(model=NAME, prompt=PROMPT, max_tokens=5, temperature=0)
        after = http.get(served[0] + "/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    assert "# TYPE marin_serve_generated_tokens_total counter" in after.text
    prompt_tokens = len(_document(tokenizer, PROMPT))
    assert _metric(after.text, "marin_serve_prompt_tokens_total") - _metric(before, "marin_serve_prompt_tokens_total") == prompt_tokens
    assert _metric(after.text, "marin_serve_generated_tokens_total") - _metric(before, "marin_serve_generated_tokens_total") == 5
    assert _metric(after.text, "marin_serve_requests_running") == 0 and _metric(after.text, "marin_serve_requests_waiting") == 0
    assert _metric(after.text, "marin_serve_generated_tokens_per_second") > 0
    assert _metric(after.text, "marin_serve_kv_blocks_used") == 0 and _metric(after.text, "marin_serve_kv_blocks_total") > 0


def test_lm_eval_local_completions_scores_like_the_in_process_adapter(served, model, tokenizer):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from levanter.eval.harness import LevanterHarnessLM
    from marin.evaluation.tasks import TASKS_DIR

    task = "marin_object_colours"

    def evaluate(lm, **model_args):
        output = lm_eval.simple_evaluate(model=lm, model_args=model_args or None, tasks=[task], log_samples=True,
                                         task_manager=TaskManager(include_path=TASKS_DIR, include_defaults=False),
                                         bootstrap_iters=0, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                         fewshot_random_seed=0)
        scores = {doc["doc_id"]: [float(ll) for ll, _ in doc["filtered_resps"]] for doc in output["samples"][task]}
        return output["results"][task], scores

    in_process, expected = evaluate(LevanterHarnessLM(model, tokenizer, batch_size=64, compute_dtype="float32"))
    over_http, scores = evaluate("local-completions", base_url=served[0] + "/v1/completions", model=NAME,
                                 max_length=CONFIG.max_seq_len, batch_size=16, max_retries=1, timeout=WAIT_S)
    assert len(scores) == len(expected) == 48
    for doc_id, choices in expected.items():
        # Each choice's log-likelihood is a sum of a few float32 log-probabilities: equal to rounding.
        assert scores[doc_id] == pytest.approx(choices, abs=1e-4), doc_id
    for metric in ("acc,none", "acc_norm,none"):
        assert over_http[metric] == in_process[metric], metric


def test_the_command_serves_an_exported_model_and_refuses_a_folder_without_one(model, tokenizer, tmp_path):
    from levanter.compat.hf_checkpoints import export_llama_to_hf

    empty = subprocess.run([sys.executable, "-m", "marin.cli", "serve-model", str(tmp_path), "--port", str(_free_port())],
                           capture_output=True, text=True, timeout=WAIT_S)
    assert empty.returncode == 2 and "holds no model" in empty.stderr and "Traceback" not in empty.stderr

    folder = export_llama_to_hf(model, str(tmp_path / "hf"), tokenizer_dir_or_obj=tokenizer.tokenizer)
    port = _free_port()
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    process = subprocess.Popen([sys.executable, "-m", "marin.cli", "serve-model", folder, "--port", str(port), "--name", "tiny",
                                "--max-batch", "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "the server did not answer in time"
            time.sleep(0.2)
        cli_client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=WAIT_S, max_retries=0)
        text = cli_client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0).choices[0].text
        assert text == _greedy(model, tokenizer, _document(tokenizer, PROMPT), 4)
    finally:
        process.terminate()
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=WAIT_S)


# -- what clients send: bounded, checked before it is tokenized (marin.model_server.limits) --------------


class _CountingTokenizer:
    """The server's tokenizer, counting the texts it is asked to encode (to show a refusal came first)."""

    def __init__(self, raw):
        self._raw = raw
        self.encoded_bytes = 0
        self._lock = threading.Lock()

    def encode(self, text, **kwargs):
        with self._lock:
            self.encoded_bytes = max(self.encoded_bytes, len(text))
        return self._raw.encode(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self._raw, name)


def _greedy_over_http(http: httpx.Client, url: str) -> str:
    answer = http.post(url + "/v1/completions", json={"model": NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["text"]


def _refused(answer: httpx.Response, status: int, *words: str) -> dict:
    assert answer.status_code == status, answer.text[:500]
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in answer.text
    assert all(word in error["message"] for word in words), error["message"]
    return error


def test_hostile_requests_are_refused_and_the_server_answers_the_same_afterwards(served, monkeypatch):
    url, server = served
    vocab = server.engine.model.vocab_size
    monkeypatch.setattr(server, "raw", _CountingTokenizer(server.raw))
    with httpx.Client(timeout=WAIT_S) as http:
        before = _greedy_over_http(http, url)

        # A body past the bound: refused by its declared length, and by what arrives without one.
        huge = json.dumps({"model": NAME, "prompt": "a" * (MAX_BODY_BYTES + 10)})
        _refused(http.post(url + "/v1/completions", content=huge, headers={"content-type": "application/json"}),
                 413, f"at most {MAX_BODY_BYTES}")

        def chunks():
            for start in range(0, len(huge), 1 << 20):
                yield huge[start:start + (1 << 20)].encode()

        _refused(http.post(url + "/v1/completions", content=chunks()), 413, f"at most {MAX_BODY_BYTES}")

        # A prompt that cannot fit the context, refused before the tokenizer sees it.
        long_prompt = "the frog " * 50_000
        error = _refused(http.post(url + "/v1/completions", json={"model": NAME, "prompt": long_prompt, "max_tokens": 1}),
                         400, "bytes of text", "context is 128 tokens")
        assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
        error = _refused(http.post(url + "/v1/chat/completions", json={"model": NAME, "messages": [
            {"role": "user", "content": long_prompt}]}), 400, "context is 128 tokens")
        assert error["param"] == "messages"
        assert server.raw.encoded_bytes < len(long_prompt) // 10

        # Text that is not Unicode (a lone surrogate, as JSON can spell one).
        body = '{"model": "%s", "prompt": "a \\ud800 b", "max_tokens": 2}' % NAME
        error = _refused(http.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"}),
                         400, "lone surrogate (U+D800) at character 2")
        assert error["param"] == "prompt"
        body = '{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}' % NAME
        assert _refused(http.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}),
                        400, "lone surrogate")["param"] == "messages"
        _refused(http.post(url + "/tokenize", content='{"prompt": "\\ud800"}', headers={"content-type": "application/json"}),
                 400, "lone surrogate")

        # Token ids the model does not have.
        for bad in (-1, 2**64, vocab):
            error = _refused(http.post(url + "/v1/completions", json={"model": NAME, "prompt": [5, bad], "max_tokens": 2}),
                             400, f"token id {bad}", f"0 to {vocab - 1}")
            assert error["param"] == "prompt"
            _refused(http.post(url + "/detokenize", json={"tokens": [bad]}), 400, f"token id {bad}")

        # JSON nested deeper than the parser goes.
        _refused(http.post(url + "/v1/completions", content="[" * 100_000, headers={"content-type": "application/json"}),
                 400, "not valid JSON")

        assert http.get(url + "/health").json() == {"status": "ok"}
        assert _greedy_over_http(http, url) == before


def test_32_concurrent_clients_get_200_answers_good_and_bad_alike(served):
    url = served[0]
    with httpx.Client(timeout=WAIT_S) as http:
        expected = _greedy_over_http(http, url)
    good = {"model": NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    kinds = [
        ("good", good, 200),
        ("ids", {"model": NAME, "prompt": [5, -1], "max_tokens": 2}, 400),
        ("long", {"model": NAME, "prompt": "frog " * 20_000, "max_tokens": 1}, 400),
        ("chat", {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4,
                  "temperature": 0}, 200),
    ]

    # httpx builds a TLS context for every client (27 ms of CPU reading the CA certificates), even for
    # plain HTTP; the 200 clients share one, and each keeps its own connection.
    tls = ssl.create_default_context()

    def one(index: int) -> tuple[str, int, str]:
        name, body, _ = kinds[index % len(kinds)]
        with httpx.Client(timeout=WAIT_S, verify=tls) as http:  # a client of its own, as separate programs would be
            answer = http.post(url + ("/v1/chat/completions" if name == "chat" else "/v1/completions"), json=body)
        text = answer.json()["choices"][0]["text"] if name == "good" and answer.status_code == 200 else ""
        return name, answer.status_code, text

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(one, range(200), timeout=4 * WAIT_S))
    assert len(results) == 200
    statuses = {name: status for name, _, status in kinds}
    assert [(name, code) for name, code, _ in results if code != statuses[name]] == []
    assert {text for name, _, text in results if name == "good"} == {expected}
    with httpx.Client(timeout=WAIT_S) as http:
        assert _greedy_over_http(http, url) == expected
