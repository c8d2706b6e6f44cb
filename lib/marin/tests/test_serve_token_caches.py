"""The data view decodes token caches whose tokenizer is a step under the prefix (the built-in one's way).

Such a tokenize step's result stores ``tokenizer_source`` relative to the prefix, so that a moved
prefix still reads; the view must resolve it there, never take it for a Hugging Face hub id.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from levanter.tokenization import loading as tokenizer_loading
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.serve import data as data_module
from marin.serve.app import create_app


def _train_tokenizer(ctx):
    texts = ctx.step.hash_attrs["texts"]
    save_tokenizer(train_bpe_tokenizer(list(texts), vocab_size=300), ctx.output_path)
    return {"path": ctx.output_path, "builtin": True}


@pytest.fixture
def hub_calls(monkeypatch):
    """Every hub lookup made, each failing as it does offline."""
    calls = []

    def offline_hub(repo_id, revision):
        calls.append(repo_id)
        raise tokenizer_loading.TokenizerNotFoundError(f"{repo_id!r}: the hub is unreachable")

    monkeypatch.setattr(tokenizer_loading, "_read_tokenizer_files_from_hub", offline_hub)
    monkeypatch.setattr(data_module, "_TOKENIZERS", {})
    monkeypatch.setattr(data_module, "_FAILED", {})
    return calls


def test_a_cache_made_with_a_tokenizer_step_decodes_without_the_hub(tmp_path, synthetic_stories, hub_calls):
    stories = list(synthetic_stories[:40])
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in stories))
    tokenizer_step = lazy_step("tokenizers/tiny-bpe", _train_tokenizer, hash_attrs={"texts": stories})
    data = tokenized("tokenized/stories", str(tmp_path / "train.jsonl"), tokenizer_step)
    prefix = str(tmp_path / "prefix")
    runner = StepRunner(prefix=prefix)
    runner.run([data])
    output = runner.output_path_for(data)
    stored = json.loads(open(f"{output}/.artifact.json").read())["result"]["tokenizer_source"]
    assert not stored.startswith("/")  # relative to the prefix, as the runner keeps it

    client = TestClient(create_app(prefix), raise_server_exceptions=False)
    cache = output[len(prefix) + 1 :] + "/train"
    page = client.get("/api/data", params={"path": cache, "count": 2, "max_tokens": 4096}).json()
    assert page["note"].startswith(f"decoded with {prefix}/{stored}")
    tokenizer = load_tokenizer(runner.output_path_for(tokenizer_step))
    for row, story in zip(page["rows"], stories):
        assert "".join(row["pieces"]) == tokenizer.tokenizer.decode(row["ids"], skip_special_tokens=False)
        assert story.split()[0] in "".join(row["pieces"])
    assert hub_calls == []


def test_a_tokenizer_that_cannot_be_loaded_is_not_tried_again_on_every_page(tmp_path, hub_calls):
    from zephyr.token_cache import finalize_token_cache, write_token_cache_shard

    step = tmp_path / "prefix" / "tokenized" / "elsewhere-0123abcd"
    write_token_cache_shard(str(step / "train" / "shard-00000"), [[1, 2, 3], [4, 5]], "uint16")
    finalize_token_cache(str(step / "train"), ["shard-00000"], vocab_size=10, metadata={"tokenizer": "sha256:" + "0" * 64})
    (step / ".executor_info").write_text(json.dumps({"name": "tokenized/elsewhere", "identity": "0123abcd" + "0" * 56}))
    (step / ".executor_status").write_text(json.dumps({"status": "SUCCESS", "time": 1.0e9}))
    (step / ".artifact.json").write_text(json.dumps({"result": {"tokenizer_source": "someone/unreachable-tokenizer"}}))
    client = TestClient(create_app(str(tmp_path / "prefix")), raise_server_exceptions=False)
    notes = [client.get("/api/data", params={"path": "tokenized/elsewhere-0123abcd/train"}).json()["note"] for _ in range(3)]
    assert hub_calls == ["someone/unreachable-tokenizer"]
    assert all("undecoded" in note and "someone/unreachable-tokenizer" in note for note in notes)
