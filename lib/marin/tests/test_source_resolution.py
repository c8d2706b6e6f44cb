"""resolve_source: hub ids (online, cached, offline with and without a built-in default) and files."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from marin.datasets import (
    BuiltinCorpusConfig,
    HubRefusedError,
    HubRevision,
    HubUnreachableError,
    HuggingFaceHub,
    SourceError,
    SourceUnavailableError,
    resolve_source,
)
from marin.datasets import sources as sources_module
from marin.datasets.builtin_corpus import DEFAULT_TRAIN_COUNT
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner

TINYSTORIES = "roneneldan/TinyStories"


class FakeHub:
    """A hub that answers from a dict (online) and a dict of cached snapshots; counts questions."""

    def __init__(self, online=None, cached=None, refuse=()):
        self.online = online
        self.cached = cached or {}
        self.refuse = set(refuse)
        self.asked = 0

    def latest_revision(self, repo_id, repo_type):
        self.asked += 1
        if repo_id in self.refuse:
            raise HubRefusedError(f"the hub refused {repo_type} {repo_id!r} (HTTP 404)")
        if self.online is None:
            raise HubUnreachableError("no network in this test")
        return self.online[repo_id]

    def cached_revision(self, repo_id, repo_type):
        if repo_id in self.cached:
            return HubRevision(repo_id, repo_type, self.cached[repo_id], "cache", f"/cache/{repo_id}/{self.cached[repo_id]}")
        return None


OFFLINE = FakeHub()


# -- hub ids -----------------------------------------------------------------------------------


def test_tinystories_offline_uses_the_builtin_corpus_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="marin.datasets"):
        resolved = resolve_source(TINYSTORIES, sample_count=1000, hub=OFFLINE)
    assert resolved.kind == "builtin" and resolved.is_builtin
    assert resolved.identity["kind"] == "builtin"
    assert resolved.identity["stands_in_for"] == TINYSTORIES
    assert resolved.identity["train_count"] >= 1000
    assert resolved.splits == ("train", "validation")
    assert resolved.deps == (resolved.step,)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "BUILT-IN OFFLINE CORPUS" in warnings[0].getMessage()
    assert TINYSTORIES in warnings[0].getMessage()


def test_builtin_identity_never_equals_the_hub_identity():
    offline = resolve_source(TINYSTORIES, hub=OFFLINE)
    online = resolve_source(TINYSTORIES, hub=FakeHub(online={TINYSTORIES: "a" * 40}))
    assert online.kind == "hub" and online.step is None and online.deps == ()
    assert online.identity == {"kind": "hub", "repo_id": TINYSTORIES, "revision": "a" * 40}
    assert offline.identity != online.identity


def test_sample_counts_share_the_default_corpus_and_larger_ones_grow_it():
    small = resolve_source(TINYSTORIES, sample_count=1000, hub=OFFLINE)
    none = resolve_source(TINYSTORIES, hub=OFFLINE)
    large = resolve_source(TINYSTORIES, sample_count=DEFAULT_TRAIN_COUNT + 1, hub=OFFLINE)
    assert small.step.identity == none.step.identity
    assert large.identity["train_count"] == DEFAULT_TRAIN_COUNT + 1
    assert large.step.identity != small.step.identity


def test_hub_unreachable_but_cached_uses_the_cached_revision():
    hub = FakeHub(cached={TINYSTORIES: "c" * 40})
    resolved = resolve_source(TINYSTORIES, hub=hub)
    assert resolved.kind == "hub"
    assert resolved.revision == "c" * 40
    assert resolved.identity == {"kind": "hub", "repo_id": TINYSTORIES, "revision": "c" * 40}
    assert "local Hugging Face cache" in resolved.description


def test_unknown_dataset_offline_gets_an_actionable_error():
    with pytest.raises(SourceUnavailableError) as error:
        resolve_source("someone/unknown-dataset", hub=OFFLINE)
    message = str(error.value)
    assert "someone/unknown-dataset" in message
    assert "hf download someone/unknown-dataset --repo-type dataset" in message
    assert "local file" in message and "Connect" in message


def test_dataset_the_hub_refuses_is_an_error_not_a_fallback():
    with pytest.raises(SourceUnavailableError, match="HTTP 404"):
        resolve_source(TINYSTORIES, hub=FakeHub(online={}, refuse={TINYSTORIES}))


def test_real_hub_client_honours_hf_hub_offline_without_touching_the_network(monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("the hub must not be asked while HF_HUB_OFFLINE is set")

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", no_network)
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE"):
        HuggingFaceHub().latest_revision(TINYSTORIES, "dataset")


def test_real_hub_client_reports_an_empty_cache_as_none(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    assert HuggingFaceHub().cached_revision("nobody/nothing-here", "dataset") is None


def test_builtin_corpus_is_built_by_a_cached_step_and_read_through_split_files(tmp_path, monkeypatch):
    tiny = BuiltinCorpusConfig(train_count=40, validation_count=8)
    monkeypatch.setitem(sources_module.OFFLINE_DEFAULTS, TINYSTORIES, lambda sample_count: tiny)
    resolved = resolve_source(TINYSTORIES, hub=OFFLINE)
    seen = {}

    def consume(ctx):
        for split, files in resolved.split_files(ctx).items():
            with open(files[0]) as f:
                seen[split] = [json.loads(line)["text"] for line in f]
        return {split: len(texts) for split, texts in seen.items()}

    consumer = lazy_step("test/consume-builtin", consume, deps=resolved.deps)
    report = StepRunner(prefix=str(tmp_path)).run([consumer])
    assert [o.outcome for o in report.outcomes] == ["ran", "ran"]
    assert {s: len(t) for s, t in seen.items()} == {"train": 40, "validation": 8}
    assert not set(seen["train"]) & set(seen["validation"])
    from storygen import generate_stories

    assert seen["train"] == generate_stories(40, seed=tiny.seed)
    # Deterministic and cached: a second run builds nothing.
    again = StepRunner(prefix=str(tmp_path)).run([consumer])
    assert [o.outcome for o in again.outcomes] == ["cached", "not_needed"]
    with pytest.raises(SourceError, match="StepContext"):
        resolved.split_files()


# -- files -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stories_folder(tmp_path_factory, synthetic_stories) -> Path:
    """``train.jsonl`` and ``validation.jsonl``, laid out as a downloaded dataset often is."""
    root = tmp_path_factory.mktemp("stories")
    for name, texts in (("train", synthetic_stories[:50]), ("validation", synthetic_stories[300:310])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return root


def test_folder_with_split_names_resolves_to_both_splits_with_content_digests(stories_folder, caplog):
    with caplog.at_level(logging.INFO, logger="marin.datasets"):
        resolved = resolve_source(str(stories_folder))
    assert resolved.kind == "files"
    assert set(resolved.files) == {"train", "validation"}
    assert resolved.files["train"][0].endswith("train.jsonl")
    train_identity = resolved.identity["splits"]["train"][0]
    assert train_identity["name"] == "train.jsonl"
    assert train_identity["size"] == (stories_folder / "train.jsonl").stat().st_size
    assert len(train_identity["sha256"]) == 64
    assert resolved.split_files() == {k: list(v) for k, v in resolved.files.items()}
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_single_file_is_all_training_data(stories_folder):
    resolved = resolve_source(str(stories_folder / "validation.jsonl"))
    assert list(resolved.files) == ["train"]


def test_file_identity_follows_content_not_location(stories_folder, tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(stories_folder / "validation.jsonl", tmp_path / folder / "docs.jsonl")
    first = resolve_source(str(tmp_path / "a" / "docs.jsonl"))
    second = resolve_source(str(tmp_path / "b" / "docs.jsonl"))
    assert first.identity == second.identity
    with open(tmp_path / "b" / "docs.jsonl", "a") as f:
        f.write(json.dumps({"text": "One more story."}) + "\n")
    assert resolve_source(str(tmp_path / "b" / "docs.jsonl")).identity != first.identity


def test_glob_assigns_splits_by_file_name(tmp_path):
    for name in ("train-00000.jsonl", "train-00001.jsonl", "valid-00000.jsonl", "notes.bin"):
        (tmp_path / name).write_text(json.dumps({"text": name}) + "\n")
    resolved = resolve_source(str(tmp_path / "*.jsonl"))
    assert [p.rsplit("/", 1)[-1] for p in resolved.files["train"]] == ["train-00000.jsonl", "train-00001.jsonl"]
    assert [p.rsplit("/", 1)[-1] for p in resolved.files["validation"]] == ["valid-00000.jsonl"]
    only_train = resolve_source(str(tmp_path / "*.jsonl"), splits=("train",))
    assert list(only_train.files) == ["train"]


def test_remote_files_are_identified_without_downloading():
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/marin-test-sources/data.jsonl", b'{"text": "hello"}\n')
    resolved = resolve_source("memory://marin-test-sources/data.jsonl")
    record = resolved.identity["splits"]["train"][0]
    assert record["url"] == "memory:///marin-test-sources/data.jsonl"
    assert record["size"] == 18
    assert resolved.files["train"] == ("memory:///marin-test-sources/data.jsonl",)


def test_missing_path_and_empty_folder_get_clear_errors(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        resolve_source(str(tmp_path / "nope.jsonl"))
    with pytest.raises(SourceError, match="matches no data files"):
        resolve_source(str(tmp_path))
    (tmp_path / "validation.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(SourceError, match="no training files"):
        resolve_source(str(tmp_path))


@pytest.mark.parametrize(
    ("failure", "expected"),
    [("connection", HubUnreachableError), ("server", HubUnreachableError), ("missing", HubRefusedError)],
)
def test_real_hub_client_tells_unreachable_from_refused(monkeypatch, failure, expected):
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    http = pytest.importorskip("httpx2")  # the HTTP client huggingface_hub builds its errors from

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    request = http.Request("GET", "https://huggingface.co/api/datasets/x/y")

    def fail(self, repo_id, **kwargs):
        assert kwargs["timeout"] == 5.0  # a short timeout: declaring an experiment must not hang
        if failure == "connection":
            raise ConnectionError("no route to host")
        if failure == "server":
            raise HfHubHTTPError("bad gateway", response=http.Response(502, request=request))
        raise RepositoryNotFoundError("not found", response=http.Response(404, request=request))

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", fail)
    client = HuggingFaceHub()
    with pytest.raises(expected):
        client.latest_revision("x/y", "dataset")
    with pytest.raises(expected):  # remembered: the hub is asked once per process
        client.latest_revision("x/y", "dataset")
