"""levanter.eval: every token scored once, exact byte counts, and bits per byte of a uniform model."""

from __future__ import annotations

import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.eval import (
    EvalSetupError,
    LmEvaluator,
    ScoringWindows,
    TokenizerMismatchError,
    document_byte_counts,
)
from levanter.eval import text_eval
from levanter.models.llama import LlamaConfig
from levanter.tokenization import SpecialTokenPolicy, encode_documents, load_tokenizer, save_tokenizer, train_bpe_tokenizer
from zephyr.dataset import Dataset
from zephyr.token_cache import TokenCache

# Non-ASCII text: a byte-level tokenizer that never saw these characters splits each over several tokens.
EXTRA = ["Der Bär aß Käse. Café ☕, naïve façade, 東京 and 🙂 emoji.", "Once upon a time <|endoftext|> in the text."]
TINY = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=128,
                   tie_word_embeddings=True)


def _write_cache(path: Path, tokenizer, texts, *, prepend_bos=False, append_eos=True) -> TokenCache:
    special = SpecialTokenPolicy.for_tokenizer(tokenizer, prepend_bos=prepend_bos, append_eos=append_eos)
    ids = [doc.tolist() for doc in encode_documents(tokenizer, texts, special)]
    metadata = {"tokenizer": tokenizer.identity, "bos_id": special.bos_id, "eos_id": special.eos_id}
    Dataset.from_list(ids, num_shards=2).write_token_cache(
        str(path), vocab_size=tokenizer.vocab_size, metadata=metadata, backend="inline")
    return TokenCache.open(str(path))


def _trained_tokenizer(folder: Path, texts, vocab_size: int):
    save_tokenizer(train_bpe_tokenizer(texts, vocab_size), str(folder))
    return load_tokenizer(str(folder))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, synthetic_stories):
    return _trained_tokenizer(tmp_path_factory.mktemp("bpe"), synthetic_stories[:100], 500)


@pytest.fixture(scope="module")
def stories(synthetic_stories):
    return list(synthetic_stories[300:316]) + EXTRA


@pytest.fixture(scope="module")
def story_cache(tmp_path_factory, bpe, stories):
    return _write_cache(tmp_path_factory.mktemp("cache") / "validation", bpe, stories)


@pytest.fixture(scope="module")
def uniform_evaluator(bpe):
    # All-zero weights: every hidden state is 0 after the final norm, so every logit is 0.
    return LmEvaluator(_model_with(bpe.vocab_size, lambda shape: np.zeros(shape)), seq_len=128, batch_size=8,
                       compute_dtype="float32")


def _model_with(vocab_size: int, values):
    """TINY with every weight from ``values(shape)``: shapes come from tracing, so no eager random init."""
    shapes = eqx.filter_eval_shape(lambda: TINY.build(vocab_size, key=jax.random.PRNGKey(0)))
    return jax.tree.map(lambda s: jnp.asarray(values(s.shape), s.dtype) if isinstance(s, jax.ShapeDtypeStruct) else s, shapes)


def test_byte_counts_match_the_original_text_exactly(story_cache, bpe, stories):
    # The case that matters: characters whose bytes are spread over several tokens.
    assert len(bpe.tokenizer.encode("東京 🙂").ids) > len("東京 🙂")
    counts = document_byte_counts(story_cache, bpe)
    assert counts.tolist() == [len(text.encode("utf-8")) for text in stories]


@pytest.mark.parametrize("seq_len", [2, 5, 16])
@pytest.mark.parametrize("eos", [True, False])
def test_windows_score_every_token_exactly_once(tmp_path, seq_len, eos):
    docs = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
    eos_id = 99 if eos else None
    stream_docs = [d + [99] if eos else d for d in docs]
    Dataset.from_list(stream_docs, num_shards=2).write_token_cache(
        str(tmp_path / "c"), vocab_size=100, metadata={"eos_id": eos_id}, backend="inline")
    windows = ScoringWindows.over(str(tmp_path / "c"), seq_len)
    stream = [t for d in stream_docs for t in d]
    targets, contexts = [], []
    for batch in windows.batches(batch_size=3):
        for tokens, mask in zip(batch.tokens, batch.loss_mask):
            for t in np.flatnonzero(mask):
                targets.append(int(tokens[t + 1]))
                contexts.append(int(tokens[t]))
    # With an EOS the first token is predicted from it; without one it can only be context.
    assert targets == (stream if eos else stream[1:])
    assert windows.scored_tokens == len(targets)
    assert contexts[0] == (99 if eos else stream[0])


def test_segment_ids_start_a_segment_at_each_document(tmp_path):
    Dataset.from_list([[5, 6, 99], [7, 99], [8, 9, 99]], num_shards=1).write_token_cache(
        str(tmp_path / "c"), vocab_size=100, metadata={"eos_id": 99}, backend="inline")
    windows = ScoringWindows.over(str(tmp_path / "c"), 6)
    tokens, mask, segments = windows.window(0)
    assert tokens.tolist() == [99, 5, 6, 99, 7, 99]
    assert segments.tolist() == [0, 1, 1, 1, 2, 2]
    assert mask.tolist() == [1, 1, 1, 1, 1, 0]
    tokens, mask, segments = windows.window(1)  # overlaps window 0 by one token; zero-padded at the end
    assert tokens.tolist() == [99, 8, 9, 99, 0, 0] and mask.tolist() == [1, 1, 1, 0, 0, 0]
    assert segments.tolist() == [0, 1, 1, 1, 1, 1]


def test_uniform_model_gives_log2_vocab_times_tokens_over_bytes(uniform_evaluator, story_cache, bpe, stories):
    result = uniform_evaluator.evaluate(story_cache, bpe)
    vocab = bpe.vocab_size
    text_bytes = sum(len(text.encode("utf-8")) for text in stories)
    assert result.tokens == story_cache.num_tokens  # every token, EOS included, scored once
    assert result.bytes == text_bytes and result.documents == len(stories)
    assert result.bits_per_byte == pytest.approx(math.log2(vocab) * result.tokens / text_bytes, rel=1e-6)  # float32 sums per row
    assert result.loss == pytest.approx(math.log(vocab), rel=1e-6)
    assert result.perplexity == pytest.approx(vocab, rel=1e-5)


def test_blocked_loss_agrees_with_materialised_logits(tmp_path, monkeypatch, bpe):
    tokenizer = bpe
    cache = _write_cache(tmp_path / "c", tokenizer, EXTRA * 3)
    rng = np.random.default_rng(1)
    model = _model_with(tokenizer.vocab_size, lambda shape: rng.normal(scale=0.5, size=shape))
    plain = LmEvaluator(model, seq_len=32, batch_size=4, compute_dtype="float32").evaluate(cache, tokenizer)
    monkeypatch.setattr(text_eval, "MAX_MATERIALISED_LOGITS", 0)
    blocked = LmEvaluator(model, seq_len=32, batch_size=4, compute_dtype="float32").evaluate(cache, tokenizer)
    assert plain.tokens == blocked.tokens and plain.bytes == blocked.bytes
    assert blocked.loss == pytest.approx(plain.loss, rel=1e-5)
    assert abs(plain.loss - math.log(tokenizer.vocab_size)) > 1e-3  # a real (non-uniform) model


def test_bos_only_cache_counts_every_byte(tmp_path, uniform_evaluator, bpe, stories):
    cache = _write_cache(tmp_path / "c", bpe, stories[:5], prepend_bos=True, append_eos=False)
    result = uniform_evaluator.evaluate(cache, bpe)
    assert result.tokens == cache.num_tokens - 1  # the leading BOS is context only
    assert result.bytes == sum(len(text.encode("utf-8")) for text in stories[:5])


def test_refuses_a_cache_from_another_tokenizer(tmp_path, uniform_evaluator, bpe):
    other = _trained_tokenizer(tmp_path / "tok", EXTRA * 20, 300)
    cache = _write_cache(tmp_path / "c", other, EXTRA)
    with pytest.raises(TokenizerMismatchError, match="decode it with the tokenizer that wrote it"):
        uniform_evaluator.evaluate(cache, bpe)


def test_refuses_a_sequence_longer_than_the_model():
    model = _model_with(16, lambda shape: np.zeros(shape))
    with pytest.raises(EvalSetupError, match="max_seq_len=128"):
        LmEvaluator(model, seq_len=256, batch_size=2)
