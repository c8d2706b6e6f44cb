"""Mistral checkpoints (``MistralForCausalLM``, ``model_type`` ``mistral``) as our Llama.

Mistral is Llama's decoder, without biases, plus an optional sliding window: each position attends
to itself and the ``sliding_window - 1`` positions before it (Mistral 7B v0.1: 4096; later
versions: none). Ours implements the window exactly (``LlamaConfig.sliding_window``); sequences no
longer than the window run the fused attention as usual, since the window then masks nothing.

Exports write ``mistral`` only for models with a sliding window: one without is plain Llama, and
is written as ``llama`` (same logits).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from levanter.compat.hf_family import HfFamily, unsupported
from levanter.compat.hf_llama import (
    expect_model_type,
    features_beyond,
    llama_layer_weights,
    llama_like_config_dict,
    llama_like_fields_from_hf,
)
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer, LlamaLMHeadModel


def mistral_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``MistralForCausalLM`` for ``config``."""
    return {
        **llama_like_config_dict(config, vocab_size, dtype, "MistralForCausalLM", "mistral"),
        "sliding_window": config.sliding_window,
    }


def mistral_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``MistralForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "mistral")
    window = hf.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise unsupported("sliding_window", window, "it must be a positive number of positions, or null for none")
    return LlamaConfig(**llama_like_fields_from_hf(hf), sliding_window=window), int(hf["vocab_size"])


def _mistral_cannot_write(config: LlamaConfig) -> str | None:
    return features_beyond(config, {"head_dim_override", "rope_scaling", "sliding_window", "activation"})


MISTRAL = HfFamily(
    "mistral", LlamaLMHeadModel, LlamaDecoderLayer, llama_layer_weights, mistral_config_dict, mistral_config_from_hf,
    cannot_write=_mistral_cannot_write,
)
