"""The lm-eval adapter scores and generates exactly as the model does, request by request."""

from __future__ import annotations

import math
from types import SimpleNamespace

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance

from levanter.eval.harness import HarnessSetupError, LevanterHarnessLM
from levanter.inference import sample
from levanter.models.llama import LlamaConfig
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer

TEXTS = ["Once upon a time, a little fox found a red ball.", "One day, the fox and the bird played in the sun."] * 4
CONFIG = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=24)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_bpe_tokenizer(TEXTS, 290), folder)
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def model(tokenizer):
    return CONFIG.build(tokenizer.vocab_size, key=jax.random.PRNGKey(3))


@pytest.fixture(scope="module")
def lm(model, tokenizer):
    return LevanterHarnessLM(model, tokenizer, batch_size=4, compute_dtype="float32")


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@eqx.filter_jit
def _forward(model, tokens):
    return model(tokens)


def _reference(model, tokens: list[int], scored: int) -> tuple[float, bool]:
    """Log-probability of the last ``scored`` tokens of ``tokens`` given the ones before, directly."""
    # Padded on the right to one width (causal attention: later positions change nothing before them),
    # so every reference shares one compiled forward pass.
    inputs = np.zeros((1, CONFIG.max_seq_len), np.int32)
    inputs[0, :len(tokens) - 1] = tokens[:-1]
    logits = np.asarray(_forward(model, jnp.asarray(inputs))[0, :len(tokens) - 1], np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    targets = tokens[1:]
    positions = range(len(targets) - scored, len(targets))
    return (sum(log_probs[p, targets[p]] for p in positions), all(int(np.argmax(logits[p])) == targets[p] for p in positions))


def test_loglikelihood_matches_the_model_and_keeps_request_order(lm, model, tokenizer):
    pairs = [("Once upon a time, a little", " fox"), ("One day, the fox and the bird", " played in the sun."),
             ("", "Once upon"), ("The", " red ball")]
    results = lm.loglikelihood(_requests("loglikelihood", pairs))
    eos = tokenizer.eos_id
    encode = lambda s: tokenizer.tokenizer.encode(s).ids  # noqa: E731
    for (context, continuation), (log_prob, greedy) in zip(pairs, results):
        whole = [eos, *encode(context + continuation)]
        scored = len(whole) - 1 - len(encode(context)) if context else len(encode(continuation))
        expected, expected_greedy = _reference(model, whole, scored)
        assert log_prob == pytest.approx(expected, rel=1e-4, abs=1e-4)
        assert greedy == expected_greedy
        assert log_prob < 0


def test_long_contexts_are_truncated_on_the_left(lm, model, tokenizer):
    context = " ".join(TEXTS)  # far longer than max_seq_len 24
    [(log_prob, _)] = lm.loglikelihood(_requests("loglikelihood", [(context, " fox")]))
    whole = [tokenizer.eos_id, *tokenizer.tokenizer.encode(context + " fox").ids]
    assert len(whole) > CONFIG.max_seq_len + 1
    expected, _ = _reference(model, whole[-(CONFIG.max_seq_len + 1):], len(tokenizer.tokenizer.encode(" fox").ids))
    assert log_prob == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_rolling_loglikelihood_scores_every_token_once(tokenizer):
    # A model with all-zero weights is uniform: each scored token costs exactly ln V.
    zero = jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_inexact_array(x) else x,
                        CONFIG.build(tokenizer.vocab_size, key=jax.random.PRNGKey(0)))
    uniform = LevanterHarnessLM(zero, tokenizer, batch_size=4, compute_dtype="float32")
    documents = [" ".join(TEXTS), "fox", TEXTS[0]]  # many windows, one token, one window
    totals = uniform.loglikelihood_rolling(_requests("loglikelihood_rolling", [(d,) for d in documents]))
    for document, total in zip(documents, totals):
        tokens = len(tokenizer.tokenizer.encode(document).ids)
        assert total == pytest.approx(-tokens * math.log(tokenizer.vocab_size), rel=1e-5)


def test_rolling_windows_match_a_direct_computation(lm, model, tokenizer):
    document = " ".join(TEXTS[:3])
    [total] = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(document,)]))
    stream = [tokenizer.eos_id, *tokenizer.tokenizer.encode(document).ids]
    expected, length = 0.0, CONFIG.max_seq_len
    for start in range(1, len(stream), length):
        end = min(start + length, len(stream))
        expected += _reference(model, stream[max(0, end - length - 1):end], end - start)[0]
    assert total == pytest.approx(expected, rel=1e-4)


def test_generate_until_is_greedy_and_stops_at_the_stop_string(lm, model, tokenizer):
    context = "Once upon a time"
    ids = [tokenizer.eos_id, *tokenizer.tokenizer.encode(context).ids]
    # Two rows, as generate_until batches the two requests below: one compiled generation serves both.
    greedy = np.asarray(sample(model, np.asarray([ids, ids], np.int32), max_new_tokens=8, temperature=0.0, eos_id=tokenizer.eos_id))
    new = [int(t) for t in greedy[0, len(ids):]]
    if tokenizer.eos_id in new:
        new = new[:new.index(tokenizer.eos_id)]
    full = tokenizer.tokenizer.decode(new)
    stop = full[len(full) // 2:][:2] or "zz"
    outputs = lm.generate_until(_requests("generate_until", [
        (context, {"until": [], "max_gen_toks": 8}),
        (context, {"until": [stop], "max_gen_toks": 8}),
    ]))
    assert outputs[0] == full
    assert stop in full and outputs[1] == full[:full.find(stop)]


def test_settings_that_cannot_work_are_refused(model, tokenizer):
    with pytest.raises(HarnessSetupError, match="max_seq_len"):
        LevanterHarnessLM(model, tokenizer, max_seq_len=CONFIG.max_seq_len + 1)
    larger = SimpleNamespace(vocab_size=model.vocab_size + 1, eos_id=0, bos_id=None)
    with pytest.raises(HarnessSetupError, match="tokenizer has"):
        LevanterHarnessLM(model, larger)
