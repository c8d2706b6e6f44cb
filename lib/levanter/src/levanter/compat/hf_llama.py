"""Llama checkpoints as Hugging Face ``LlamaForCausalLM`` folders, and what the Llama-like
families (Mistral, Qwen, Gemma) share.

``LlamaLMHeadModel`` is Hugging Face's Llama with the same names for the same things: a decoder
layer is the shared attention and norms (:func:`~levanter.compat.hf_family.attention_weights`)
plus a SwiGLU MLP whose three projections are plain linear maps. Llama's own options carry over:
rescaled RoPE (``rope_scaling`` of type ``linear`` or ``llama3``, Llama 3.1 and later), tied
embeddings, ``attention_bias`` (q/k/v and output biases), ``mlp_bias``, a ``head_dim`` of its own
and the MLP activation.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import jax.numpy as jnp
import numpy as np

from levanter.compat.hf_family import (
    ACTIVATION_TO_HF,
    HfFamily,
    LayerWeight,
    activation_from_hf,
    attention_bias_weights,
    attention_weights,
    decoder_config_dict,
    head_dim_from_hf,
    iter_family_tensors,
    norm_weight,
    read_checkpoint,
    renamed,
    rope_from_hf,
    shape_fields_from_hf,
    transposed,
    write_checkpoint,
)
from levanter.compat.hf_format import DEFAULT_MAX_SHARD_BYTES, HfFormatError
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer, LlamaLMHeadModel

# -- what every Llama-like family shares --------------------------------------------------------------


def llama_layer_weights(config: LlamaConfig, norm_offset: float = 0.0) -> list[LayerWeight]:
    """A decoder layer's weights with whichever optional biases and head norms ``config`` has."""
    weights = attention_weights(config, norm_offset)
    if config.qkv_bias:
        weights += attention_bias_weights(config)
    if config.o_bias:
        weights.append(renamed("attention.o_bias.weight", "self_attn.o_proj.bias"))
    if config.qk_norm and config.qk_norm_scope == "projection":  # ours [heads, d] <-> theirs [heads * d]
        d = config.head_dim
        weights += [
            renamed(f"attention.{p}_norm.weight", f"self_attn.{p}_norm.weight", lambda w: w.reshape(-1), lambda t, n=n: t.reshape(n, d))
            for p, n in (("q", config.num_heads), ("k", config.num_kv_heads))
        ]
    elif config.qk_norm:
        weights += [
            norm_weight("attention.q_norm.weight", "self_attn.q_norm.weight", norm_offset),
            norm_weight("attention.k_norm.weight", "self_attn.k_norm.weight", norm_offset),
        ]
    weights += [
        transposed("mlp.gate_proj.weight", "mlp.gate_proj.weight"),
        transposed("mlp.up_proj.weight", "mlp.up_proj.weight"),
        transposed("mlp.down_proj.weight", "mlp.down_proj.weight"),
    ]
    if config.mlp_bias:
        weights += [renamed(f"mlp.{p}_bias.weight", f"mlp.{p}_proj.bias") for p in ("gate", "up", "down")]
    return weights


def llama_like_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any, architecture: str, model_type: str) -> dict:
    """The ``config.json`` fields every Llama-like family writes the same way."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        **decoder_config_dict(config, vocab_size, dtype),
        "hidden_act": ACTIVATION_TO_HF[config.activation],
    }


def llama_like_fields_from_hf(hf: dict, *, tie_default: bool = False, activation_field: str = "hidden_act",
                              default_activation: str = "silu") -> dict:
    """The ``LlamaConfig`` fields every Llama-like family reads the same way: sizes, RoPE (with
    scaling), a head size of its own, the MLP activation."""
    theta, scaling = rope_from_hf(hf)
    return dict(
        **shape_fields_from_hf(hf, tie_default=tie_default),
        rope_theta=theta,
        rope_scaling=scaling,
        head_dim_override=head_dim_from_hf(hf),
        activation=activation_from_hf(hf, activation_field, default_activation),
    )


def expect_model_type(hf: dict, *model_types: str | None) -> None:
    if hf.get("model_type") not in model_types:
        expected = " or ".join(repr(t) for t in model_types if t is not None)
        raise HfFormatError(f"Expected model_type {expected}, got model_type {hf.get('model_type')!r}.")


def features_beyond(config: LlamaConfig, allowed: set[str]) -> str | None:
    """Why a family that can hold only the options in ``allowed`` cannot hold ``config``, or None."""
    used = {
        "head_dim_override": config.head_dim_override is not None,
        "rope_scaling": config.rope_scaling is not None,
        "qkv_bias": config.qkv_bias,
        "o_bias": config.o_bias,
        "mlp_bias": config.mlp_bias,
        "qk_norm": config.qk_norm,
        "sliding_window": config.sliding_window is not None,
        "activation": config.activation != "silu",
        "scale_embeddings": config.scale_embeddings,
        "norm_placement": config.norm_placement != "pre",
        "qk_norm_scope": config.qk_norm_scope != "head",
        "layer_types": config.layer_types is not None,
        "attention_logit_softcap": config.attention_logit_softcap is not None,
        "final_logit_softcap": config.final_logit_softcap is not None,
        "attention_scale_dim": config.attention_scale_dim is not None,
        "sliding_rope_theta": config.sliding_rope_theta is not None,
    }
    beyond = [name for name, on in used.items() if on and name not in allowed]
    return f"it has no place for {', '.join(beyond)}" if beyond else None


# -- Llama itself ----------------------------------------------------------------------------------


def hf_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``LlamaForCausalLM`` for ``config``."""
    return {
        **llama_like_config_dict(config, vocab_size, dtype, "LlamaForCausalLM", "llama"),
        "attention_bias": config.qkv_bias,
        "mlp_bias": config.mlp_bias,
    }


def llama_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``LlamaForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, None, "llama")
    attention_bias = bool(hf.get("attention_bias", False))
    config = LlamaConfig(
        **llama_like_fields_from_hf(hf), qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=bool(hf.get("mlp_bias", False))
    )
    return config, int(hf["vocab_size"])


def _llama_cannot_write(config: LlamaConfig) -> str | None:
    if config.qkv_bias != config.o_bias:
        return "Llama's attention_bias puts biases on q, k, v and the output projection alike, not on only some of them"
    return features_beyond(config, {"head_dim_override", "rope_scaling", "qkv_bias", "o_bias", "mlp_bias", "activation"})


LLAMA = HfFamily(
    "llama", LlamaLMHeadModel, LlamaDecoderLayer, llama_layer_weights, hf_config_dict, llama_config_from_hf,
    cannot_write=_llama_cannot_write,
)


def iter_hf_tensors(model: LlamaLMHeadModel) -> Iterator[tuple[str, np.ndarray]]:
    """Every weight under its ``LlamaForCausalLM`` state-dict name, one at a time (host numpy)."""
    return iter_family_tensors(LLAMA, model)


def llama_to_hf_tensors(model: LlamaLMHeadModel) -> dict[str, np.ndarray]:
    return dict(iter_hf_tensors(model))


def export_llama_to_hf(model: LlamaLMHeadModel, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` as a ``LlamaForCausalLM`` checkpoint folder; returns the folder (see ``export_to_hf``)."""
    if not isinstance(model, LlamaLMHeadModel):
        raise TypeError(f"export_llama_to_hf needs a LlamaLMHeadModel, got {type(model).__name__}.")
    return write_checkpoint(LLAMA, model, out_dir, tokenizer_dir_or_obj=tokenizer_dir_or_obj, max_shard_bytes=max_shard_bytes)


def import_llama_from_hf(path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False, dtype: Any = jnp.float32) -> LlamaLMHeadModel:
    """Load a ``LlamaForCausalLM`` checkpoint folder (config.json + safetensors; a local path or any URL) as our model."""
    return read_checkpoint(LLAMA, path, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing, dtype=dtype)
