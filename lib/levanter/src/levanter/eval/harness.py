"""Our language models under lm-eval-harness: an ``lm_eval`` ``LM`` that scores and generates with them.

``lm_eval`` is an optional, third-party dependency: this module imports it, and nothing else in
``levanter.eval`` imports this module, so ``import levanter.eval`` works without it.

Scoring (``loglikelihood``, ``loglikelihood_rolling``) packs every request into rows of at most
``max_seq_len`` input tokens, batches them (longest first, padded to a few bucket lengths so a run
compiles a handful of shapes) and scores them with one jitted function. Generation uses
``levanter.inference.sample`` (greedy unless the task asks for a temperature) and cuts the text at
the first stop string.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from lm_eval.api.model import TemplateLM

from levanter.errors import LevanterError
from levanter.inference.sampling import sample
from levanter.trainer.mixed_precision import cast_floating, resolve_compute_dtype

logger = logging.getLogger(__name__)

_MIN_BUCKET = 16
_PROGRESS_EVERY_SECONDS = 10.0


class HarnessSetupError(LevanterError, ValueError):
    """The adapter cannot work with this model, tokenizer or setting."""


@dataclass(frozen=True)
class _Row:
    """``tokens[:-1]`` are the inputs, ``tokens[1:]`` the targets; the last ``scored`` targets count."""

    tokens: list[int]
    scored: int


@eqx.filter_jit
def _score_rows(model, tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row: the summed log-probability of the masked targets, and whether each was the argmax."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs).astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    target_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    greedy = jnp.argmax(logits, axis=-1) == targets
    return jnp.sum(jnp.where(mask, target_log_probs, 0.0), axis=-1), jnp.all(greedy | ~mask, axis=-1)


class LevanterHarnessLM(TemplateLM):
    """An ``lm_eval`` model backed by one of our decoder-only models and its tokenizer.

    ``model``: a ``LlamaLMHeadModel`` (or any model with the same call and ``config``); ``tokenizer``:
    a ``levanter.tokenization.HfTokenizer``. ``max_seq_len`` (default: the model's) bounds every
    scored row: contexts are truncated on the left. ``batch_size`` rows are scored per step.
    ``max_gen_toks`` is the generation budget when a task does not set one.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_seq_len: int | None = None,
        batch_size: int = 8,
        max_gen_toks: int = 64,
        compute_dtype: str = "auto",
        seed: int = 0,
    ):
        super().__init__()
        model_max = model.config.max_seq_len
        self.max_seq_len = int(max_seq_len or model_max)
        if not 2 <= self.max_seq_len <= model_max:
            raise HarnessSetupError(f"max_seq_len must be between 2 and the model's max_seq_len {model_max}, got {max_seq_len}.")
        if batch_size < 1:
            raise HarnessSetupError(f"batch_size must be a positive integer, got {batch_size}.")
        if tokenizer.vocab_size > model.vocab_size:
            raise HarnessSetupError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {model.vocab_size}; "
                "pass the tokenizer the model was trained with."
            )
        if tokenizer.eos_id is None and tokenizer.bos_id is None:
            raise HarnessSetupError("the tokenizer has neither an EOS nor a BOS token, needed as the context of empty prompts.")
        self.model = cast_floating(model, resolve_compute_dtype(compute_dtype))
        self.hf_tokenizer = tokenizer
        self.batch_size_per_step = batch_size
        self.max_gen_toks = max_gen_toks
        self._key = jax.random.PRNGKey(seed)

    # --- tokenization, as TemplateLM expects it -------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        eos = self.hf_tokenizer.eos_id
        return eos if eos is not None else self.hf_tokenizer.bos_id

    @property
    def prefix_token_id(self) -> int:
        # The token every training document was preceded by: BOS when the tokenizer has one.
        bos = self.hf_tokenizer.bos_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.max_seq_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids of ``string``; unless ``add_special_tokens`` is False, after the prefix token.

        Our models are trained on documents packed behind an EOS (or BOS) token, so a prompt that
        starts with it looks like the start of a training document.
        """
        ids = self.hf_tokenizer.tokenizer.encode(string, add_special_tokens=False).ids
        return ids if add_special_tokens is False else [self.prefix_token_id, *ids]

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.hf_tokenizer.tokenizer.decode(list(tokens), skip_special_tokens=True)

    # --- scoring ---------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        rows = []
        for _, context_enc, continuation_enc in requests:
            if not continuation_enc:
                raise HarnessSetupError("a loglikelihood request has an empty continuation; there is nothing to score.")
            whole = (list(context_enc) + list(continuation_enc))[-(self.max_seq_len + 1):]
            rows.append(_Row(whole, min(len(continuation_enc), len(whole) - 1)))
        results = self._score(rows, "loglikelihood")
        for (pair, _, _), result in zip(requests, results):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole document, every token scored exactly once.

        The document follows the prefix token; it is cut into chunks of up to ``max_seq_len``
        targets, and each chunk is scored in a row that ends at it and starts up to ``max_seq_len``
        tokens earlier, so the last, partial chunk still sees a full window of context.
        """
        rows, owner = [], []
        for index, request in enumerate(requests):
            (text,) = request.args
            stream = self.tok_encode(text, add_special_tokens=True)
            for start in range(1, len(stream), self.max_seq_len):
                end = min(start + self.max_seq_len, len(stream))
                rows.append(_Row(stream[max(0, end - self.max_seq_len - 1):end], end - start))
                owner.append(index)
        totals = [0.0] * len(requests)
        for index, (log_prob, _) in zip(owner, self._score(rows, "loglikelihood_rolling")):
            totals[index] += log_prob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def _score(self, rows: list[_Row], what: str) -> list[tuple[float, bool]]:
        """Score rows in batches of similar length; results in the order of ``rows``."""
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i].tokens))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        started = last_log = time.monotonic()
        for first in range(0, len(order), self.batch_size_per_step):
            batch = order[first:first + self.batch_size_per_step]
            width = self._bucket(max(len(rows[i].tokens) for i in batch))
            tokens = np.full((self.batch_size_per_step, width + 1), self.eot_token_id, np.int32)
            mask = np.zeros((self.batch_size_per_step, width), bool)
            for slot, i in enumerate(batch):
                row = rows[i]
                tokens[slot, :len(row.tokens)] = row.tokens
                mask[slot, len(row.tokens) - 1 - row.scored:len(row.tokens) - 1] = True
            log_probs, greedy = jax.device_get(_score_rows(self.model, jnp.asarray(tokens), jnp.asarray(mask)))
            for slot, i in enumerate(batch):
                results[i] = (float(log_probs[slot]), bool(greedy[slot]))
            now = time.monotonic()
            if now - last_log > _PROGRESS_EVERY_SECONDS:
                done = first + len(batch)
                rate = done / (now - started)
                logger.info("%s: %d/%d rows, %.1f rows/s, ETA %.0f s", what, done, len(rows), rate, (len(rows) - done) / rate)
                last_log = now
        return results

    def _bucket(self, tokens: int) -> int:
        """Input width for rows of up to ``tokens`` tokens: a power of two (few compiled shapes), capped."""
        width = _MIN_BUCKET
        while width < tokens - 1:
            width *= 2
        return min(width, self.max_seq_len)

    # --- generation ------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continue each context, cut at the first of its stop strings (``until``).

        Greedy by default (``temperature`` 0); a task's ``temperature`` > 0 with ``do_sample``
        samples. Requests whose encoded contexts have the same length and settings run as one batch.
        """
        prepared = []
        for request in requests:
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs or {})
            # Without stop strings, generation ends at EOS or after max_gen_toks tokens.
            until = gen_kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
            do_sample = bool(gen_kwargs.pop("do_sample", False))
            temperature = float(gen_kwargs.pop("temperature", 0.0)) if do_sample else 0.0
            max_new = max(1, min(max_new, self.max_seq_len - 1))
            ids = self.tok_encode(context, add_special_tokens=True)
            ids = ids[-(self.max_seq_len - max_new):]
            prepared.append((ids, max_new, temperature, until))

        outputs: list[str] = [""] * len(requests)
        groups: dict[tuple[int, int, float], list[int]] = {}
        for index, (ids, max_new, temperature, _) in enumerate(prepared):
            groups.setdefault((len(ids), max_new, temperature), []).append(index)
        for (_, max_new, temperature), members in groups.items():
            for first in range(0, len(members), self.batch_size_per_step):
                chunk = members[first:first + self.batch_size_per_step]
                self._key, key = jax.random.split(self._key)
                prompt = np.asarray([prepared[i][0] for i in chunk], np.int32)
                out = np.asarray(sample(self.model, prompt, max_new_tokens=max_new, temperature=temperature,
                                        eos_id=self.hf_tokenizer.eos_id, key=key))
                for row, i in zip(out, chunk):
                    outputs[i] = _cut_at_stops(self._decode_new(row[prompt.shape[1]:]), prepared[i][3])
        for request, text in zip(requests, outputs):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return outputs

    def _decode_new(self, new_tokens: Iterable[int]) -> str:
        new = [int(t) for t in new_tokens]
        eos = self.hf_tokenizer.eos_id
        if eos is not None and eos in new:
            new = new[:new.index(eos)]
        return self.tok_decode(new)


def _cut_at_stops(text: str, stops: Sequence[str]) -> str:
    cut = len(text)
    for stop in stops:
        if stop:
            position = text.find(stop)
            if position != -1:
                cut = min(cut, position)
    return text[:cut]
