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


def generate_text(model, tokenizer, prompts: Sequence[str], config: SamplingConfig = SamplingConfig()) -> list[str]:
    """Continue each prompt; returns prompt + continuation, stopping at the tokenizer's EOS.

    ``tokenizer`` is a ``levanter.tokenization.HfTokenizer``. Prompts are generated one at a time
    because they differ in length; each one compiles once per prompt length.
    """
    eos_id = tokenizer.eos_id
    raw = tokenizer.tokenizer
    key = jax.random.PRNGKey(config.seed)
    max_new = min(config.max_new_tokens, model.config.max_seq_len)
    texts = []
    for prompt in prompts:
        ids = raw.encode(prompt, add_special_tokens=False).ids
        if tokenizer.bos_id is not None:
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
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id)]
        texts.append(prompt + raw.decode(new, skip_special_tokens=True))
    return texts
