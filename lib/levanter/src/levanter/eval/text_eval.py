"""Evaluating a language model on token caches: loss, perplexity and bits per byte.

Every token of a cache is scored exactly once (:class:`~levanter.eval.scoring_windows.ScoringWindows`),
so the sum of its negative log-likelihoods (in nats) and the bytes of the text it came from
(:func:`~levanter.eval.byte_counts.document_byte_counts`) refer to the same text, and

    bits per byte = total nats / ln 2 / total UTF-8 bytes

is comparable across tokenizers: a tokenizer with longer tokens has fewer, harder predictions, and
the per-byte figure cancels that out. EOS predictions are scored (knowing where a document ends is
part of modelling the text) and carry no bytes.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from levanter.errors import LevanterError
from levanter.eval.byte_counts import check_tokenizer_matches, document_byte_counts, token_bytes
from levanter.eval.scoring_windows import ScoringWindows
from levanter.models.lm import final_logit_softcap
from levanter.models.loss import fused_next_token_loss, next_token_loss
from levanter.trainer.mixed_precision import cast_floating, resolve_compute_dtype
from rigging.progress import terminal_bar
from zephyr.token_cache import TokenCache

logger = logging.getLogger(__name__)

# Above this many logits per batch (1 GiB in float32) the loss is computed block by block from the
# hidden states instead of materialising [batch, seq, vocab] logits.
MAX_MATERIALISED_LOGITS = 2**28
# Logits per block on the blocked path: large blocks keep accelerators busy, and memory stays bounded.
BLOCK_LOGITS = 2**26
_PROGRESS_EVERY_SECONDS = 10.0


class EvalSetupError(LevanterError, ValueError):
    """An evaluation that cannot work as asked (sequence too long, vocabularies that do not fit)."""


@dataclass(frozen=True)
class TextEvalResult:
    """One model on one token cache. ``loss`` is mean nats per scored token."""

    loss: float
    perplexity: float
    bits_per_byte: float
    tokens: int
    bytes: int
    documents: int
    nats: float


def bits_per_byte(total_nats: float, total_bytes: int) -> float:
    """Total negative log-likelihood in nats, converted to bits and divided by the bytes it covers."""
    if total_bytes <= 0:
        raise EvalSetupError("bits per byte needs text with at least one byte")
    return total_nats / math.log(2) / total_bytes


def perplexity(loss: float) -> float:
    """exp(mean nats per token); the largest float for losses whose exponential overflows."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float(np.finfo(np.float64).max)


class LmEvaluator:
    """One model, compiled once, evaluated on any number of token caches of the same shape settings.

    ``compute_dtype``: a policy of ``levanter.trainer.mixed_precision`` (``"auto"`` is bf16 on
    accelerators, f32 on CPU); the loss itself is summed in float32 per row of a batch and in
    float64 across rows and batches.
    """

    def __init__(self, model: Any, *, seq_len: int, batch_size: int, compute_dtype: str = "auto"):
        if batch_size < 1:
            raise EvalSetupError(f"batch_size must be >= 1, got {batch_size}")
        max_len = getattr(getattr(model, "config", None), "max_seq_len", None)
        if max_len is not None and seq_len > max_len:
            raise EvalSetupError(f"seq_len={seq_len} is longer than the model's max_seq_len={max_len}; use seq_len <= {max_len}.")
        self.model = model
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.compute_dtype = resolve_compute_dtype(compute_dtype)
        self.vocab_size = int(model.vocab_size)
        self._params, static = eqx.partition(model, eqx.is_inexact_array)
        blocked = (
            callable(getattr(model, "hidden_states", None))
            and callable(getattr(model, "unembedding", None))
            and batch_size * seq_len * self.vocab_size > MAX_MATERIALISED_LOGITS
        )
        # Rows are scored side by side (vmap), so one block holds block_size tokens of every row.
        block_size = max(BLOCK_LOGITS // (self.vocab_size * batch_size), 16)
        softcap = final_logit_softcap(model)
        dtype = self.compute_dtype

        def loss_sums(params, tokens, mask, segment_ids):
            net = eqx.combine(cast_floating(params, dtype), static)
            # Sums per row, added up on the host in float64: one float32 sum over a whole batch
            # would lose about one part in a million of the total.
            if blocked:
                hidden, _ = net.hidden_states(tokens, segment_ids=segment_ids)
                unembedding = net.unembedding()
                sums = jax.vmap(lambda h, t, m: fused_next_token_loss(
                    h[None], unembedding, t[None], m[None], block_size=block_size, logit_softcap=softcap
                ))(hidden, tokens, mask)
            else:
                logits = net.forward(tokens, segment_ids=segment_ids).logits
                sums = jax.vmap(lambda x, t, m: next_token_loss(x[None], t[None], m[None]))(logits, tokens, mask)
            return sums.loss_sum, sums.weight_sum

        self._loss_sums = jax.jit(loss_sums)

    def score(self, windows: ScoringWindows, *, name: str | None = None) -> tuple[float, int]:
        """(total nats, scored tokens) of ``windows``."""
        if windows.seq_len != self.seq_len:
            raise EvalSetupError(f"windows of seq_len {windows.seq_len} given to an evaluator built for {self.seq_len}")
        if windows.cache.vocab_size > self.vocab_size:
            raise EvalSetupError(
                f"token cache {windows.cache.url} has a vocabulary of {windows.cache.vocab_size:,} ids, more than the "
                f"model's {self.vocab_size:,}; evaluate with a model trained on this tokenizer."
            )
        label = name or windows.cache.url
        total = windows.num_batches(self.batch_size)
        nats, weight = 0.0, 0.0
        pending = None
        started = last_log = time.perf_counter()
        bar = terminal_bar(total, f"eval {name or 'cache'}", unit="batch")  # on a terminal; else log lines
        for i, batch in enumerate(windows.batches(self.batch_size)):
            out = self._loss_sums(self._params, jnp.asarray(batch.tokens), jnp.asarray(batch.loss_mask), jnp.asarray(batch.segment_ids))
            # Fetch the previous batch's sums while this one runs, so the device always has work queued.
            if pending is not None:
                nats, weight = nats + _total(pending[0]), weight + _total(pending[1])
            pending = out
            now = time.perf_counter()
            if bar is not None:
                bar.update(1)
            elif now - last_log >= _PROGRESS_EVERY_SECONDS:
                last_log = now
                rate = (i + 1) / (now - started)
                logger.info("eval %s: batch %d/%d, %.0f tokens/s, ETA %.0fs", label, i + 1, total,
                            rate * self.batch_size * self.seq_len, (total - i - 1) / rate)
        if bar is not None:
            bar.close()
        if pending is not None:
            nats, weight = nats + _total(pending[0]), weight + _total(pending[1])
        if int(round(weight)) != windows.scored_tokens:
            raise RuntimeError(f"scored {weight} tokens of {label}, expected {windows.scored_tokens}")
        return nats, windows.scored_tokens

    def evaluate(self, cache: TokenCache | str, tokenizer: Any, *, name: str | None = None) -> TextEvalResult:
        """Loss, perplexity and bits per byte of the model on every token of ``cache``.

        ``tokenizer`` is the one that wrote the cache (an ``HfTokenizer``, checked against the identity
        the cache records); it only decodes documents to count their bytes.
        """
        if isinstance(cache, str):
            cache = TokenCache.open(cache)
        check_tokenizer_matches(cache, tokenizer)
        started = time.perf_counter()
        windows = ScoringWindows.over(cache, self.seq_len)
        nats, tokens = self.score(windows, name=name)
        total_bytes = int(document_byte_counts(cache, tokenizer).sum())
        if windows.prefix_id is None:
            # The stream's first token is context only; its bytes (none for a BOS) are not covered.
            first = int(cache.read_tokens(0, 1)[0])
            if first != cache.metadata.get("bos_id"):
                total_bytes -= token_bytes(tokenizer, first)
        loss = nats / tokens
        result = TextEvalResult(
            loss=loss,
            perplexity=perplexity(loss),
            bits_per_byte=bits_per_byte(nats, total_bytes),
            tokens=tokens,
            bytes=total_bytes,
            documents=cache.num_documents,
            nats=nats,
        )
        elapsed = time.perf_counter() - started
        logger.info("eval %s: loss %.4f, perplexity %.2f, %.4f bits/byte over %d tokens, %d bytes (%.1fs, %.0f tokens/s)",
                    name or cache.url, result.loss, result.perplexity, result.bits_per_byte, tokens, total_bytes,
                    elapsed, tokens / max(elapsed, 1e-9))
        return result


def _total(row_sums: jax.Array) -> float:
    return float(np.asarray(row_sums, dtype=np.float64).sum())


def evaluate_cache(
    model: Any, cache: TokenCache | str, tokenizer: Any, *, seq_len: int, batch_size: int, compute_dtype: str = "auto"
) -> TextEvalResult:
    """One-shot :meth:`LmEvaluator.evaluate` (build an :class:`LmEvaluator` to reuse the compiled step)."""
    return LmEvaluator(model, seq_len=seq_len, batch_size=batch_size, compute_dtype=compute_dtype).evaluate(cache, tokenizer)
