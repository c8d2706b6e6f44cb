"""Text in, text out: prompts encoded with a tokenizer, continued by a model, decoded back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np

from levanter.inference.sampling import sample


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick each next token. ``temperature=0`` is greedy; ``top_k``/``top_p`` truncate."""

    max_new_tokens: int = 128
    temperature: float = 0.8
    top_k: int | None = 50
    top_p: float | None = 0.95
    seed: int = 0


def generate_text(
    model,
    tokenizer,
    prompts: Sequence[str],
    config: SamplingConfig = SamplingConfig(),
    *,
    add_bos: bool = True,
    stop_text: str | None = None,
    include_prompt: bool = True,
) -> list[str]:
    """Continue each prompt; returns prompt + continuation, stopping at the tokenizer's EOS.

    ``tokenizer`` is a ``levanter.tokenization.HfTokenizer``. Prompts are generated one at a time
    because they differ in length; each one compiles once per prompt length. ``add_bos``: put the
    tokenizer's BOS before each prompt, as training put it before each document (a rendered chat
    prompt carries what its template puts there instead). ``stop_text``: also stop where the
    continuation first contains this text (a chat template's end of turn), cut before it; a text
    that is one token stops sampling there. ``include_prompt=False`` returns the continuation alone.
    """
    raw = tokenizer.tokenizer
    stop_id = _single_token(raw, stop_text)
    eos_id = stop_id if stop_id is not None else tokenizer.eos_id
    key = jax.random.PRNGKey(config.seed)
    max_new = min(config.max_new_tokens, model.config.max_seq_len)
    texts = []
    for prompt in prompts:
        ids = raw.encode(prompt, add_special_tokens=False).ids
        if add_bos and tokenizer.bos_id is not None:
            ids = [tokenizer.bos_id, *ids]
        key, subkey = jax.random.split(key)
        out = np.asarray(
            sample(
                model,
                np.asarray(ids, np.int32),
                max_new_tokens=min(max_new, model.config.max_seq_len - len(ids)),
                temperature=config.temperature,
                top_k=None if config.top_k is None else min(config.top_k, model.vocab_size),
                top_p=config.top_p,
                eos_id=eos_id,
                key=subkey,
            )
        )
        new = out[len(ids):].tolist()
        for stop in (eos_id, tokenizer.eos_id):
            if stop is not None and stop in new:
                new = new[: new.index(stop)]
        continuation = raw.decode(new, skip_special_tokens=True)
        if stop_text and stop_text in continuation:
            continuation = continuation[: continuation.index(stop_text)]
        texts.append(prompt + continuation if include_prompt else continuation)
    return texts


def _single_token(raw_tokenizer, text: str | None) -> int | None:
    """The id of ``text`` when the tokenizer encodes it as exactly one token, else None."""
    if not text:
        return None
    ids = raw_tokenizer.encode(text, add_special_tokens=False).ids
    return ids[0] if len(ids) == 1 else None
