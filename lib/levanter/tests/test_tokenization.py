"""Tokenizers: loading and identity, exact batch encoding with BOS/EOS, bounded pieces, BPE training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from levanter.tokenization import (
    HfTokenizer,
    MissingSpecialTokenError,
    SpecialTokenPolicy,
    TokenIdOverflowError,
    TokenizerNotFoundError,
    encode_documents,
    load_tokenizer,
    save_tokenizer,
    split_text,
    train_bpe_tokenizer,
)


@pytest.fixture(scope="module")
def stories(synthetic_stories) -> list[str]:
    return list(synthetic_stories[:300])


@pytest.fixture(scope="module")
def tokenizer_folder(stories, tmp_path_factory) -> Path:
    """A small byte-level BPE (GPT-2's pre-tokenizer, 400 tokens, ``<|endoftext|>`` as id 0)."""
    return Path(save_tokenizer(train_bpe_tokenizer(stories[:100], 400), tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def tok(tokenizer_folder) -> HfTokenizer:
    return load_tokenizer(tokenizer_folder / "tokenizer.json")


def test_identity_is_content_not_name(tok, tokenizer_folder, tmp_path):
    tokenizer_json = tokenizer_folder / "tokenizer.json"
    assert load_tokenizer(tokenizer_folder).identity == tok.identity and tok.identity.startswith("sha256:")
    # Same content, other file name, other formatting and key order: same identity.
    reformatted = tmp_path / "renamed.json"
    reformatted.write_text(json.dumps(json.loads(tokenizer_json.read_text()), indent=4))
    assert load_tokenizer(reformatted).identity == tok.identity
    changed = json.loads(tokenizer_json.read_text())
    changed["added_tokens"][0]["content"] = "<|end|>"
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    assert load_tokenizer(tmp_path / "changed.json").identity != tok.identity


def test_exact_ids_for_the_shared_sample_plus_eos(real_data):
    gpt2 = load_tokenizer(real_data.gpt2)
    assert gpt2.vocab_size == 50257 and gpt2.eos_id == 50256
    with open(real_data.train, encoding="utf-8") as f:
        stories = [json.loads(line)["text"] for line in f]
    raw = tokenizers.Tokenizer.from_file(str(real_data.gpt2 / "tokenizer.json")).encode_batch(stories)
    ours = encode_documents(gpt2, stories, SpecialTokenPolicy.for_tokenizer(gpt2, prepend_bos=False, append_eos=True))
    assert len(ours) == 1800
    assert sum(len(r.ids) for r in raw) == 368_877
    for expected, got in zip(raw, ours):
        assert got.tolist() == expected.ids + [50256]


def test_bos_is_prepended_when_asked(tok):
    policy = SpecialTokenPolicy.for_tokenizer(tok, prepend_bos=True, append_eos=False)
    (ids,) = encode_documents(tok, ["Hello there"], policy)
    assert ids.tolist() == [tok.bos_id] + tok.tokenizer.encode("Hello there").ids


def test_ids_in_a_narrower_dtype_are_the_same_ids_and_never_wrap(tok, stories):
    policy = SpecialTokenPolicy.for_tokenizer(tok, prepend_bos=True, append_eos=True)
    wide = encode_documents(tok, stories[:50], policy)
    narrow = encode_documents(tok, stories[:50], policy, dtype=np.uint16)
    assert all(n.dtype == np.uint16 and n.tolist() == w.tolist() for n, w in zip(narrow, wide))
    # A long text takes the piece-by-piece path: the same ids there too.
    text = " ".join(stories[:40])
    (long_narrow,) = encode_documents(tok, [text], policy, max_piece_chars=300, dtype=np.uint16)
    assert long_narrow.tolist() == encode_documents(tok, [text], policy)[0].tolist()
    # Ids of 400 fit uint16 but not a dtype of 256 values: refused, not wrapped to other ids.
    with pytest.raises(TokenIdOverflowError, match="cannot hold"):
        encode_documents(tok, stories[:50], policy, dtype=np.uint8)


def test_missing_paths_and_uncached_hub_ids_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(TokenizerNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nowhere" / "tokenizer.json")
    with pytest.raises(TokenizerNotFoundError, match="has no tokenizer.json"):
        load_tokenizer(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(TokenizerNotFoundError, match="not in the local cache"):
        load_tokenizer("some-org/not-a-cached-tokenizer")


def test_split_pieces_give_the_unsplit_ids(tok, stories):
    text = "\n\n".join(stories[:40]) + "  trailing  spaces and 12345 numbers"
    pieces = list(split_text(text, 300))
    assert len(pieces) > 10 and "".join(pieces) == text and max(map(len, pieces)) <= 300
    (joined,) = encode_documents(tok, [text], max_piece_chars=300)
    assert joined.tolist() == tok.tokenizer.encode(text).ids


class _RecordingTokenizer:
    """Stands in for the Rust tokenizer to record what each encode_batch call is given."""

    def __init__(self):
        self.calls: list[list[int]] = []

    def encode_batch(self, texts, add_special_tokens=True):
        self.calls.append([len(t) for t in texts])
        return [type("Encoding", (), {"ids": [len(t) % 7]})() for t in texts]


def test_a_50mb_document_is_encoded_in_bounded_pieces():
    huge = "All work and no play makes a dull story. " * (50_000_000 // 41)
    recorder = HfTokenizer(source="recorder", tokenizer_json="{}", identity="sha256:x")
    object.__setattr__(recorder, "_tokenizer", _RecordingTokenizer())
    (ids,) = encode_documents(recorder, [huge], max_piece_chars=100_000, max_batch_chars=1_000_000)
    calls = recorder.tokenizer.calls
    assert max(max(call) for call in calls) <= 100_000
    assert max(sum(call) for call in calls) <= 1_000_000 + 100_000
    assert sum(sum(call) for call in calls) == len(huge)
    assert len(ids) == sum(len(call) for call in calls) >= 500


def test_trained_bpe_is_deterministic_and_loads_in_transformers(stories, tmp_path):
    first = train_bpe_tokenizer(stories[:300], 600)
    second = train_bpe_tokenizer(stories[:300], 600)
    assert first.to_str() == second.to_str()
    assert first.get_vocab_size() == 600 and first.token_to_id("<|endoftext|>") == 0
    folder = save_tokenizer(first, tmp_path / "tok")
    assert {p.name for p in Path(folder).iterdir()} == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}

    loaded = load_tokenizer(folder)
    assert loaded.eos_id == 0 and loaded.identity == load_tokenizer(Path(folder) / "tokenizer.json").identity
    text = "Once upon a time, a little fox found a shiny stone."
    assert first.decode(first.encode(text).ids) == text  # byte-level: lossless

    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(folder)
    assert hf(text)["input_ids"] == first.encode(text).ids
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == 0


def test_append_eos_without_an_eos_token_is_refused(stories):
    tok = train_bpe_tokenizer(stories[:50], 300, special_tokens=())
    plain = HfTokenizer(source="no-eos", tokenizer_json=tok.to_str(), identity="sha256:y")
    with pytest.raises(MissingSpecialTokenError, match="append_eos=False"):
        SpecialTokenPolicy.for_tokenizer(plain, prepend_bos=False, append_eos=True)
    assert isinstance(plain.tokenizer, tokenizers.Tokenizer)


def test_tokenizer_folder_copy_keeps_identity(tok, tokenizer_folder, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tokenizer_folder, copy)
    assert load_tokenizer(copy).identity == tok.identity


def test_hub_id_is_read_from_the_local_cache_when_offline(tok, tokenizer_folder, tmp_path, monkeypatch):
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--some-org--bpe-copy"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_folder / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cached = load_tokenizer("some-org/bpe-copy")
    assert cached.identity == tok.identity and cached.eos_id == tok.eos_id == 0
