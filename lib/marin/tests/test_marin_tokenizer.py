"""marin_tokenizer and TokenizerRef: the hub tokenizer when it can be had, else a built-in BPE step."""

from __future__ import annotations

import logging
import os

import pytest
from levanter.tokenization import load_tokenizer

from experiments.marin_tokenizer import MARIN_TOKENIZER_HUB_ID, OFFLINE_VOCAB_SIZE, marin_tokenizer
from marin.datasets import (
    BuiltinCorpusConfig,
    HubRefusedError,
    HubRevision,
    HubUnreachableError,
    TokenizerRef,
    TokenizerUnavailableError,
    TrainedTokenizer,
    as_tokenizer_spec,
    builtin_tinystories,
    builtin_tokenizer,
)
from storygen import generate_stories
from marin.execution.lazy import LazyStep
from marin.execution.step_runner import StepRunner


class FakeHub:
    def __init__(self, online=None, cached=None, refuse=()):
        self.online, self.cached, self.refuse = online, cached or {}, set(refuse)

    def latest_revision(self, repo_id, repo_type):
        assert repo_type == "model"
        if repo_id in self.refuse:
            raise HubRefusedError(f"the hub refused model {repo_id!r} (HTTP 401)")
        if self.online is None:
            raise HubUnreachableError("no network in this test")
        return self.online[repo_id]

    def cached_revision(self, repo_id, repo_type):
        if repo_id in self.cached:
            return HubRevision(repo_id, repo_type, "c" * 40, "cache", self.cached[repo_id])
        return None


def test_offline_marin_tokenizer_is_a_builtin_step_and_the_log_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="marin.datasets"):
        resolved = marin_tokenizer.resolve(hub=FakeHub())
    assert resolved.kind == "builtin" and resolved.is_builtin
    assert isinstance(resolved.spec, LazyStep)
    assert resolved.deps == (resolved.spec,)
    assert resolved.spec.hash_attrs["tokenizer"].vocab_size == OFFLINE_VOCAB_SIZE
    # It learns from the built-in corpus, so it depends on that corpus's step.
    assert [d.name for d in resolved.spec.deps] == [builtin_tinystories().name]
    assert resolved.identity["stands_in_for"] == MARIN_TOKENIZER_HUB_ID
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "BUILT-IN OFFLINE TOKENIZER" in warning.getMessage()
    assert MARIN_TOKENIZER_HUB_ID in warning.getMessage()
    # The size it has once trained on the built-in corpus, as every later log line says, not the size asked.
    assert "byte-level BPE, 4,063 tokens (of 4,096 asked)" in warning.getMessage()


def test_online_and_cached_marin_tokenizer_mean_the_hub_tokenizer():
    online = marin_tokenizer.resolve(hub=FakeHub(online={MARIN_TOKENIZER_HUB_ID: "a" * 40}))
    assert (online.kind, online.spec, online.revision) == ("hub", MARIN_TOKENIZER_HUB_ID, "a" * 40)
    assert online.deps == ()
    cached = marin_tokenizer.resolve(hub=FakeHub(cached={MARIN_TOKENIZER_HUB_ID: "/hf-cache/snapshot"}))
    assert (cached.kind, cached.spec) == ("cache", "/hf-cache/snapshot")
    offline = marin_tokenizer.resolve(hub=FakeHub())
    assert offline.identity != online.identity
    assert offline.identity != cached.identity


def test_ref_without_offline_default_fails_clearly_offline():
    ref = TokenizerRef("someone/some-tokenizer")
    with pytest.raises(TokenizerUnavailableError) as error:
        ref.resolve(hub=FakeHub())
    assert "someone/some-tokenizer" in str(error.value)
    assert "hf download someone/some-tokenizer" in str(error.value)
    with pytest.raises(TokenizerUnavailableError, match="HTTP 401"):
        ref.resolve(hub=FakeHub(online={}, refuse={"someone/some-tokenizer"}))


def test_resolution_with_the_default_hub_is_remembered_per_process(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []
    ref = TokenizerRef("someone/remembered", offline_default=lambda: calls.append(1) or builtin_tinystories())
    first = ref.resolve()
    assert ref.resolve() is first
    assert len(calls) == 1
    assert as_tokenizer_spec(ref) is first.spec
    assert as_tokenizer_spec("gpt2") == "gpt2"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small built-in tokenizer, trained once through the runner on a small built-in corpus."""
    prefix = str(tmp_path_factory.mktemp("prefix"))
    corpus = builtin_tinystories(BuiltinCorpusConfig(train_count=150, validation_count=10))
    step = builtin_tokenizer(vocab_size=512, corpus=corpus)
    report = StepRunner(prefix=prefix).run([step])
    return prefix, step, report


def test_builtin_tokenizer_step_writes_a_loadable_tokenizer_folder(trained):
    _, _, report = trained
    assert [o.outcome for o in report.outcomes] == ["ran", "ran"]
    result = report.outcomes[-1].result
    assert isinstance(result, TrainedTokenizer)
    assert os.path.exists(os.path.join(result.path, "tokenizer.json"))
    assert 256 < result.vocab_size <= 512
    loaded = load_tokenizer(result.path)
    assert loaded.identity == result.identity
    assert loaded.eos_token == "<|endoftext|>" and loaded.eos_id is not None
    text = generate_stories(1, seed=99)[0]
    ids = loaded.tokenizer.encode(text).ids
    assert loaded.tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2  # it learned merges, not just bytes


def test_builtin_tokenizer_step_is_cached_and_deterministic(trained, tmp_path):
    prefix, step, first = trained
    again = StepRunner(prefix=prefix).run([step])
    assert [o.outcome for o in again.outcomes] == ["cached", "not_needed"]
    # Trained again from scratch under another prefix: the same content, so the same identity.
    elsewhere = StepRunner(prefix=str(tmp_path)).run([step])
    assert elsewhere.outcomes[-1].result.identity == first.outcomes[-1].result.identity


def test_vocab_size_is_part_of_the_step_identity():
    assert builtin_tokenizer(vocab_size=512).identity != builtin_tokenizer(vocab_size=1024).identity
