"""Gemma (the first generation, ``model_type`` ``gemma``) checkpoints as our Llama; Gemma 2 refused.

Gemma is Llama's decoder with four differences, each expressible exactly:

- input embeddings are multiplied by ``sqrt(hidden_size)`` (``LlamaConfig.scale_embeddings``;
  the tied output projection uses the table unscaled);
- the MLP gate is the tanh-approximated GELU (``activation="gelu_tanh"``; transformers'
  ``gelu_pytorch_tanh``, which Gemma configs also spell ``gelu``);
- every RMSNorm multiplies by ``1 + w`` instead of ``w``: a reparametrisation, so the conversion
  adds 1 to each norm weight on import and subtracts it on export (``norm_offset``), in float32;
- a ``head_dim`` of its own (256), and tied embeddings by default.

Gemma 2 (``gemma2``) is not read: it adds tanh soft-capping of the attention scores
(``attn_logit_softcapping``), which our fused attention kernels do not compute; of the final logits
(``final_logit_softcapping``); a sliding window in every other layer (``sliding_window`` with
``layer_types``); a query scale of ``query_pre_attn_scalar**-0.5`` instead of ``head_dim**-0.5``;
and norms after attention and the MLP (``pre_feedforward_layernorm``,
``post_feedforward_layernorm``). Each would be a fork of the decoder layer rather than an option.
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

# Gemma's RMSNorm multiplies by (1 + w).
GEMMA_NORM_OFFSET = 1.0

GEMMA2_REFUSAL = (
    "Gemma 2 checkpoints are not supported: attention-score soft-capping (attn_logit_softcapping), "
    "final-logit soft-capping (final_logit_softcapping), sliding-window attention in alternate layers "
    "(sliding_window, layer_types), the query scale query_pre_attn_scalar and the extra norms "
    "(pre_feedforward_layernorm, post_feedforward_layernorm) have no counterpart in our decoder"
)


def _gemma_layer_weights(config: LlamaConfig):
    return llama_layer_weights(config, GEMMA_NORM_OFFSET)


def gemma_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``GemmaForCausalLM`` for ``config``."""
    return {**llama_like_config_dict(config, vocab_size, dtype, "GemmaForCausalLM", "gemma"), "attention_bias": config.qkv_bias}


def gemma_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``GemmaForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "gemma")
    if hf.get("use_bidirectional_attention"):
        raise unsupported("use_bidirectional_attention", hf["use_bidirectional_attention"], "our attention is causal")
    # Gemma's published configs say "gelu" and mean the tanh approximation; transformers reads it so.
    # (Older configs also carry hidden_activation, which transformers 5 ignores.)
    hf = {**hf, "hidden_act": "gelu_pytorch_tanh" if hf.get("hidden_act") in (None, "gelu") else hf["hidden_act"]}
    bias = bool(hf.get("attention_bias", False))
    fields = llama_like_fields_from_hf(hf, tie_default=True)
    config = LlamaConfig(**fields, scale_embeddings=True, qkv_bias=bias, o_bias=bias)
    return config, int(hf["vocab_size"])


def _gemma_cannot_write(config: LlamaConfig) -> str | None:
    if not config.scale_embeddings:
        return "Gemma always scales its embeddings by sqrt(hidden_size)"
    if config.qkv_bias != config.o_bias:
        return "Gemma's attention_bias puts biases on q, k, v and the output projection alike"
    if config.activation == "gelu":
        return "Gemma reads hidden_act 'gelu' as the tanh approximation, so the exact GELU cannot be written"
    return features_beyond(
        config, {"head_dim_override", "rope_scaling", "qkv_bias", "o_bias", "activation", "scale_embeddings"}
    )


GEMMA = HfFamily(
    "gemma", LlamaLMHeadModel, LlamaDecoderLayer, _gemma_layer_weights, gemma_config_dict, gemma_config_from_hf,
    cannot_write=_gemma_cannot_write, norm_offset=GEMMA_NORM_OFFSET,
)
