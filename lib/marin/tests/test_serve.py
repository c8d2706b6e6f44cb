"""``marin serve`` against a tiny prefix made here: real steps, a fake training run, a token cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient
from iris.attempt_log import AttemptLog, AttemptOutcome
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec
from marin.serve.app import create_app
from marin.serve.paths import PathOutsidePrefixError, clean_relative
from zephyr.token_cache import finalize_token_cache, write_token_cache_shard

TRAIN_STEPS = 7
LOG_LINES = 20_000  # ~200 KB: more than one window of the log view
EVAL_EVERY = 3


def _write_rows(output_path):
    with open(f"{output_path}/rows.jsonl", "w") as handle:
        handle.writelines(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(45))
    return {"rows": 45}


def _count(ctx):
    return {"counted": ctx.load_artifact("data/raw").result["rows"]}


@pytest.fixture(scope="module")
def served(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("serve")
    prefix = str(root / "prefix")
    raw_v1 = StepSpec(name="data/raw", fn=_write_rows, hash_attrs={"source": "example", "rows": 45})
    raw_v2 = StepSpec(name="data/raw", fn=_write_rows, hash_attrs={"source": "example", "rows": 46})
    counted = StepSpec(name="data/count", fn=_count, deps=[raw_v1])
    runner = StepRunner(prefix)
    runner.run([counted])
    runner.run([raw_v2])

    # A training step folder as train_lm leaves it: status, info, metrics.jsonl, eval.json, samples.
    train = Path(prefix) / "checkpoints" / "tiny-0123abcd"
    train.mkdir(parents=True)
    (train / ".executor_info").write_text(json.dumps({"name": "checkpoints/tiny", "identity": "0123abcd" + "0" * 56,
                                                      "version": "v1", "hash_attrs": {"lr": 0.001}, "deps": []}))
    (train / ".executor_status").write_text(json.dumps({"status": "SUCCESS", "time": 1.0e9}))
    with open(train / "metrics.jsonl", "w") as handle:
        for step in range(1, TRAIN_STEPS + 1):
            record = {"step": step, "loss": 5.0 - 0.5 * step, "lr": 1e-3, "tokens_per_second": 1000.0 + step, "mfu": 0.1}
            if step % EVAL_EVERY == 0:
                record["eval/tinystories/loss"] = 4.0 - 0.1 * step
            handle.write(json.dumps(record) + "\n")
        handle.write("{torn line\n")
    (train / "eval.json").write_text(json.dumps({"step": TRAIN_STEPS, "train_loss": 1.5, "eval": {"tinystories": 3.3}}))
    (train / ".artifact.json").write_text(json.dumps({"result": {"samples": ["Once upon a time there was a cat."]}}))

    # A tokenize step folder: a token cache inside it, its result naming where the tokenizer is.
    tokenizer_dir = str(root / "tokenizer")
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:50], vocab_size=400), tokenizer_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    stories = list(synthetic_stories[:5])
    tokens = Path(prefix) / "tokenized" / "stories-89abcdef"
    cache = tokens / "train"
    write_token_cache_shard(str(cache / "shard-00000"), [tokenizer.tokenizer.encode(s).ids for s in stories[:3]], "uint16")
    write_token_cache_shard(str(cache / "shard-00001"), [tokenizer.tokenizer.encode(s).ids for s in stories[3:]], "uint16")
    finalize_token_cache(str(cache), ["shard-00000", "shard-00001"], vocab_size=tokenizer.vocab_size,
                         metadata={"tokenizer": tokenizer.identity, "split": "train"})
    (tokens / ".executor_info").write_text(json.dumps({"name": "tokenized/stories", "identity": "89abcdef" + "1" * 56,
                                                       "version": "v1", "hash_attrs": {}, "deps": []}))
    (tokens / ".executor_status").write_text(json.dumps({"status": "RUNNING", "time": 2.0e9}))
    (tokens / ".artifact.json").write_text(json.dumps({"result": {"tokenizer_source": tokenizer_dir}}))

    # The training step's attempts: preempted on two replicas through an iris job, then succeeded.
    first = AttemptLog.begin(str(train), replicas=2, engine="slurm", job_id="train-tiny-3f2a", job_attempt=1)
    first.append(0, b"step 1 loss 4.5\n")
    first.append(1, b"replica 1 ready\n")
    first.finish(AttemptOutcome.PREEMPTED, "node went away", [75, 75])
    second = AttemptLog.begin(str(train), engine="slurm", job_id="train-tiny-3f2a", job_attempt=2)
    second.append(0, b"resumed from step 1\n" + b"".join(f"line {i}\n".encode() for i in range(LOG_LINES)))
    second.finish(AttemptOutcome.SUCCEEDED, "", [0])

    # A step whose record of what ran is damaged.
    broken = Path(prefix) / "broken" / "step-fedcba98"
    broken.mkdir(parents=True)
    (broken / ".executor_info").write_text("{not json")
    (broken / ".executor_status").write_text(json.dumps({"status": "FAILED", "time": 1.0e9}))

    client = TestClient(create_app(prefix), raise_server_exceptions=False)
    steps = {row["name"]: row for row in client.get("/api/steps").json()["steps"] if row["name"] != "data/raw"}
    raws = [row for row in client.get("/api/steps").json()["steps"] if row["name"] == "data/raw"]
    return {"client": client, "prefix": prefix, "steps": steps, "raws": raws, "counted": counted,
            "stories": stories, "tokenizer": tokenizer, "raw_v1": raw_v1}


def test_step_list_shows_every_step_with_status(served):
    client = served["client"]
    listed = client.get("/api/steps").json()["steps"]
    names = sorted(row["name"] for row in listed)
    assert names == ["broken/step", "checkpoints/tiny", "data/count", "data/raw", "data/raw", "tokenized/stories"]
    by_path = {row["path"]: row for row in listed}
    assert by_path["checkpoints/tiny-0123abcd"]["status"] == "SUCCESS"
    assert by_path["tokenized/stories-89abcdef"]["status"] == "RUNNING"
    assert by_path["broken/step-fedcba98"]["record_damaged"] is True
    html = client.get("/").text
    assert 'id="filter"' in html and "/api/steps" in html
    for name in ("data/count", "checkpoints/tiny", "tokenized/stories"):
        assert name in html


def test_step_page_shows_hash_attributes_lineage_and_files(served):
    client = served["client"]
    raw = next(r for r in served["raws"] if r["identity"] == served["raw_v1"].identity)
    page = client.get("/step", params={"path": raw["path"]})
    assert page.status_code == 200
    assert "rows" in page.text and "45" in page.text and 'id="hash-attrs"' in page.text
    assert "data/count" in page.text  # drawn as a dependent in the lineage graph
    assert "rows.jsonl" in page.text
    detail = client.get("/api/step", params={"path": raw["path"]}).json()
    assert detail["executor_info"]["hash_attrs"] == {"source": "example", "rows": 45}
    assert detail["dependents"] == [served["steps"]["data/count"]["path"]]
    count = client.get("/api/step", params={"path": served["steps"]["data/count"]["path"]}).json()
    assert [d["path"] for d in count["dependencies"]] == [raw["path"]]


def test_step_page_diffs_against_another_version(served):
    client = served["client"]
    first, second = served["raws"]
    detail = client.get("/api/step", params={"path": first["path"], "compare": second["path"]}).json()
    assert detail["other_versions"] == [second["path"]]
    assert any("hash_attrs.rows changed" in line for line in detail["differences"])
    page = client.get("/step", params={"path": first["path"], "compare": second["path"]})
    assert "hash_attrs.rows changed" in page.text


def test_step_page_lists_attempts_and_a_log_opens_at_its_tail(served):
    client = served["client"]
    path = served["steps"]["checkpoints/tiny"]["path"]
    page = client.get("/step", params={"path": path}).text
    rows = re.findall(r'<tr data-attempt="(\d+)" data-outcome="(\w+)">(.*?)</tr>', page)
    assert [(n, outcome) for n, outcome, _ in rows] == [("1", "PREEMPTED"), ("2", "SUCCEEDED")]
    assert "train-tiny-3f2a" in rows[0][2] and "75, 75" in rows[0][2] and "node went away" in rows[0][2]
    assert rows[0][2].count('class="log-link"') == 2 and rows[1][2].count('class="log-link"') == 1
    attempts = client.get("/api/attempts", params={"path": path}).json()["attempts"]
    assert [(a["engine"], a["job_attempt"], a["replicas"]) for a in attempts] == [("slurm", 1, [0, 1]), ("slurm", 2, [0])]

    log = client.get("/log", params={"path": path, "attempt": 1, "replica": 1})
    assert log.status_code == 200 and "replica 1 ready" in log.text and "node went away" in log.text
    tail = client.get("/api/log", params={"path": path, "attempt": 2}).json()
    written = "resumed from step 1\n" + "".join(f"line {i}\n" for i in range(LOG_LINES))
    assert tail["size"] == tail["end"] == len(written) and written.endswith(tail["text"])
    assert 0 < len(tail["text"]) <= 64 * 1024 < len(written)  # a window, not the whole log
    earlier = client.get("/api/log", params={"path": path, "attempt": 2, "before": tail["start"]}).json()
    assert earlier["end"] == tail["start"] and written[earlier["start"] : tail["end"]] == earlier["text"] + tail["text"]
    html = client.get("/log", params={"path": path, "attempt": 2}).text
    assert 'id="earlier"' in html and 'id="follow"' not in html  # finished: nothing to follow
    assert client.get("/log", params={"path": path, "attempt": 3}).status_code == 404


def test_training_chart_draws_every_metrics_point(served):
    client = served["client"]
    path = served["steps"]["checkpoints/tiny"]["path"]
    series = client.get("/api/metrics", params={"path": path}).json()["series"]
    assert len(series["loss"]) == TRAIN_STEPS
    assert series["loss"][0] == [1, 4.5]
    assert len(series["eval/tinystories/loss"]) == TRAIN_STEPS // EVAL_EVERY
    page = client.get("/runs", params={"run": path}).text
    counts = {name: int(n) for name, n in re.findall(r'data-series="([^"]+)" data-points="(\d+)"', page)}
    assert counts["checkpoints/tiny 0123abcd"] == TRAIN_STEPS  # loss, lr, tokens/s and MFU charts
    assert counts["checkpoints/tiny 0123abcd · tinystories"] == TRAIN_STEPS // EVAL_EVERY
    assert page.count("<polyline class=\"series\"") == 5  # a line per series (each also has a faint raw twin)
    assert "Once upon a time there was a cat." in page


def test_evaluations_table_reads_eval_json(served):
    table = served["client"].get("/api/evals").json()
    assert table["metrics"]["tinystories loss"] == {"checkpoints/tiny (0123abcd)": 3.3}


def test_data_browser_pages_a_jsonl_file(served):
    client = served["client"]
    raw = served["raws"][0]["path"]
    first = client.get("/api/data", params={"path": f"{raw}/rows.jsonl", "start": 0, "count": 20}).json()
    assert [row["id"] for row in first["rows"]] == list(range(20)) and first["has_more"]
    last = client.get("/api/data", params={"path": f"{raw}/rows.jsonl", "start": 40, "count": 20}).json()
    assert [row["id"] for row in last["rows"]] == list(range(40, 45)) and not last["has_more"]
    page = client.get("/data", params={"path": f"{raw}/rows.jsonl", "start": 20})
    assert page.status_code == 200 and "row 20" in page.text and "next" in page.text


def test_data_browser_decodes_a_token_cache_with_its_tokenizer(served):
    client = served["client"]
    data = client.get("/api/data", params={"path": "tokenized/stories-89abcdef/train", "start": 2, "count": 2,
                                           "max_tokens": 4096}).json()
    assert data["kind"] == "tokens" and data["total"] == 5
    stories, tokenizer = served["stories"], served["tokenizer"]
    for row, story in zip(data["rows"], stories[2:4]):
        assert row["ids"] == tokenizer.tokenizer.encode(story).ids  # the second row crosses into shard 1
        assert "".join(row["pieces"]) == tokenizer.tokenizer.decode(row["ids"])
    page = client.get("/data", params={"path": "tokenized/stories-89abcdef/train", "count": 1})
    assert 'class="tok"' in page.text and "<span title=" in page.text


@pytest.mark.parametrize("bad", ["..", "../outside", "data/../../etc", "/etc/passwd", "file:///etc/passwd",
                                 "s3://bucket/x", "~/x", "a\\..\\b"])
def test_paths_leaving_the_prefix_are_refused(served, bad):
    client = served["client"]
    for route in ("/data", "/step", "/api/data", "/api/step", "/api/metrics"):
        response = client.get(route, params={"path": bad})
        assert 400 <= response.status_code < 500, (route, bad, response.status_code)
        assert "Traceback" not in response.text
    with pytest.raises(PathOutsidePrefixError):
        clean_relative(bad)


def test_missing_step_and_corrupt_record_give_error_pages(served):
    client = served["client"]
    missing = client.get("/step", params={"path": "no/such-step"})
    assert missing.status_code == 404 and "no step output" in missing.text
    broken = client.get("/step", params={"path": "broken/step-fedcba98"})
    assert broken.status_code == 422
    assert ".executor_info is corrupt" in broken.text and "Traceback" not in broken.text
    assert client.get("/api/step", params={"path": "broken/step-fedcba98"}).json()["error"] == "Unreadable file"
    assert client.get("/data", params={"path": "nothing-here"}).status_code == 404
    assert client.get("/no-such-page").status_code == 404


def test_cli_registers_serve_bound_to_localhost():
    from marin.cli import build_parser

    args = build_parser().parse_args(["serve", "--prefix", "/tmp/x"])
    assert args.host == "127.0.0.1" and args.port > 0
