"""Qwen2 / Qwen2.5 (``qwen2``) and Qwen3 (``qwen3``) checkpoints as our Llama.

Both are Llama's decoder with one addition each:

- Qwen2: biases on the q, k and v projections (none on the output projection or the MLP).
- Qwen3: an RMSNorm over each query and key head before RoPE (``q_norm``/``k_norm``, weight
  ``[head_dim]``), and a ``head_dim`` of its own (128 whatever the width); ``attention_bias`` puts
  biases on q, k, v and the output projection alike.

Qwen's optional sliding-window layers (``use_sliding_window``; off in every released Qwen2.5 and
Qwen3 model) apply to some layers only, which our decoder cannot express: they are refused.
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


def _refuse_sliding_layers(hf: dict) -> None:
    if hf.get("use_sliding_window"):
        raise unsupported("use_sliding_window", hf["use_sliding_window"], "windowed attention in only some layers is not implemented")
    layer_types = hf.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        raise unsupported("layer_types", sorted(set(layer_types)), "every layer must be 'full_attention'")


def _qwen_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any, architecture: str, model_type: str) -> dict:
    return {
        **llama_like_config_dict(config, vocab_size, dtype, architecture, model_type),
        "use_sliding_window": False,
        "sliding_window": None,
    }


# -- Qwen2 -------------------------------------------------------------------------------------------


def qwen2_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Qwen2ForCausalLM`` for ``config``."""
    hf = _qwen_config_dict(config, vocab_size, dtype, "Qwen2ForCausalLM", "qwen2")
    del hf["attention_bias"]  # Qwen2 has no such field: its q/k/v biases are always there
    return hf


def qwen2_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``Qwen2ForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "qwen2")
    _refuse_sliding_layers(hf)
    return LlamaConfig(**llama_like_fields_from_hf(hf), qkv_bias=True), int(hf["vocab_size"])


def _qwen2_cannot_write(config: LlamaConfig) -> str | None:
    if not config.qkv_bias:
        return "Qwen2 always has q/k/v biases"
    return features_beyond(config, {"head_dim_override", "rope_scaling", "qkv_bias", "activation"})


QWEN2 = HfFamily(
    "qwen2", LlamaLMHeadModel, LlamaDecoderLayer, llama_layer_weights, qwen2_config_dict, qwen2_config_from_hf,
    cannot_write=_qwen2_cannot_write,
)

# -- Qwen3 -------------------------------------------------------------------------------------------


def qwen3_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Qwen3ForCausalLM`` for ``config``."""
    return {**_qwen_config_dict(config, vocab_size, dtype, "Qwen3ForCausalLM", "qwen3"), "attention_bias": config.qkv_bias}


def qwen3_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``Qwen3ForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "qwen3")
    _refuse_sliding_layers(hf)
    bias = bool(hf.get("attention_bias", False))
    # transformers' Qwen3 default head_dim (128) applies when config.json leaves it out.
    hf = {"head_dim": 128, **hf}
    return LlamaConfig(**llama_like_fields_from_hf(hf), qk_norm=True, qkv_bias=bias, o_bias=bias), int(hf["vocab_size"])


def _qwen3_cannot_write(config: LlamaConfig) -> str | None:
    if not config.qk_norm:
        return "Qwen3 always has query/key norms"
    if config.qkv_bias != config.o_bias:
        return "Qwen3's attention_bias puts biases on q, k, v and the output projection alike"
    return features_beyond(config, {"head_dim_override", "rope_scaling", "qkv_bias", "o_bias", "qk_norm", "activation"})


QWEN3 = HfFamily(
    "qwen3", LlamaLMHeadModel, LlamaDecoderLayer, llama_layer_weights, qwen3_config_dict, qwen3_config_from_hf,
    cannot_write=_qwen3_cannot_write,
)
