"""Gemma checkpoints, of all three generations (``gemma``, ``gemma2``, ``gemma3_text``), as our Llama.

Gemma is Llama's decoder with four differences, each expressible exactly:

- input embeddings are multiplied by ``sqrt(hidden_size)`` (``LlamaConfig.scale_embeddings``;
  the tied output projection uses the table unscaled);
- the MLP gate is the tanh-approximated GELU (``activation="gelu_tanh"``; transformers'
  ``gelu_pytorch_tanh``, which Gemma configs also spell ``gelu``);
- every RMSNorm multiplies by ``1 + w`` instead of ``w``: a reparametrisation, so the conversion
  adds 1 to each norm weight on import and subtracts it on export (``norm_offset``), in float32;
- a ``head_dim`` of its own (256), and tied embeddings by default.

Gemma 2 (``gemma2``) keeps all of that and adds, each an option of ``LlamaConfig``:

- tanh soft-capping of the attention scores (``attn_logit_softcapping`` ->
  ``attention_logit_softcap``; the fused kernels that cannot compute it, cuDNN's and the Pallas GPU
  one, are refused for it) and of the output logits (``final_logit_softcapping`` ->
  ``final_logit_softcap``);
- scores divided by ``sqrt(query_pre_attn_scalar)`` rather than ``sqrt(head_dim)``
  (``attention_scale_dim``);
- a sliding window in every other layer, starting with the first (``sliding_window`` and
  ``layer_types``);
- a norm on each sublayer's input and output, four a layer (``norm_placement="both"``:
  ``pre_feedforward_layernorm`` is the MLP's input norm, ``post_attention_layernorm`` and
  ``post_feedforward_layernorm`` the outputs'), all scaling by ``1 + w``;
- its activation named by ``hidden_activation`` (``hidden_act`` is ignored, as transformers does).

Gemma 3's text model (``gemma3_text``, ``Gemma3ForCausalLM``) is Gemma 2 without soft-capping (by
default) plus a per-head query/key RMSNorm (``qk_norm``, also ``1 + w``), five sliding layers to
one full (``layer_types``, or the older ``sliding_window_pattern``), and a RoPE per kind of layer:
``rope_theta`` and ``rope_scaling`` in the full-attention layers, plain RoPE of base
``rope_local_base_freq`` in the sliding ones (``sliding_rope_theta``). The multimodal ``gemma3``
checkpoints (a vision tower beside the text model) are refused.

Layers of different kinds are not stacked, so the mixed patterns load with ``use_scan=False``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from levanter.compat.hf_family import HfFamily, layer_types_from_hf, rope_from_hf, unsupported
from levanter.compat.hf_llama import (
    expect_model_type,
    features_beyond,
    llama_layer_weights,
    llama_like_config_dict,
    llama_like_fields_from_hf,
)
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer, LlamaLMHeadModel
from levanter.models.transformer import LAYER_TYPES

# Gemma's RMSNorm multiplies by (1 + w).
GEMMA_NORM_OFFSET = 1.0

GEMMA3_MULTIMODAL_REFUSAL = (
    "Gemma 3 with a vision tower (Gemma3ForConditionalGeneration, vision_config) is not supported; "
    "only the text model (model_type 'gemma3_text', Gemma3ForCausalLM) is read"
)

# transformers' defaults for fields a Gemma 2 / 3 config.json may leave out.
GEMMA_HEAD_DIM = 256
GEMMA_SLIDING_WINDOW = 4096
GEMMA2_ATTENTION_SOFTCAP = 50.0
GEMMA2_FINAL_SOFTCAP = 30.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6  # every sixth layer attends fully
GEMMA3_ROPE_THETA = 1_000_000.0
GEMMA3_LOCAL_ROPE_THETA = 10_000.0


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


# -- Gemma 2 and 3: what they share -------------------------------------------------------------------


def _later_gemma_fields(hf: dict, period: int, softcaps: tuple[float | None, float | None]) -> dict:
    """The ``LlamaConfig`` fields Gemma 2 and 3 read alike (all but RoPE)."""
    if hf.get("use_bidirectional_attention"):
        raise unsupported("use_bidirectional_attention", hf["use_bidirectional_attention"], "our attention is causal")
    layer_types = layer_types_from_hf(hf, period)
    window = hf.get("sliding_window", GEMMA_SLIDING_WINDOW)
    if "sliding_attention" in layer_types and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise unsupported("sliding_window", window, "sliding_attention layers need a positive number of positions")
    hf = {"head_dim": GEMMA_HEAD_DIM, **hf}
    scale_dim = hf.get("query_pre_attn_scalar", GEMMA_HEAD_DIM)
    bias = bool(hf.get("attention_bias", False))
    # transformers reads the activation from hidden_activation only; RoPE each generation reads its own way.
    shared = llama_like_fields_from_hf(
        {**hf, "rope_parameters": None, "rope_scaling": None}, tie_default=True, activation_field="hidden_activation",
        default_activation="gelu_pytorch_tanh",
    )
    del shared["rope_theta"], shared["rope_scaling"]
    return dict(
        **shared,
        scale_embeddings=True,
        norm_placement="both",
        qkv_bias=bias,
        o_bias=bias,
        sliding_window=window if "sliding_attention" in layer_types else None,
        layer_types=layer_types,
        attention_logit_softcap=hf.get("attn_logit_softcapping", softcaps[0]),
        final_logit_softcap=hf.get("final_logit_softcapping", softcaps[1]),
        # None where it is the head size, the plain scale.
        attention_scale_dim=None if scale_dim == hf["head_dim"] else scale_dim,
    )


def _later_gemma_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any, architecture: str, model_type: str) -> dict:
    hf = llama_like_config_dict(config, vocab_size, dtype, architecture, model_type)
    hf["hidden_activation"] = hf.pop("hidden_act")
    return {
        **hf,
        "attention_bias": config.qkv_bias,
        "sliding_window": config.sliding_window,
        "layer_types": ["sliding_attention" if config.window_of(i) is not None else "full_attention" for i in range(config.num_layers)],
        "attn_logit_softcapping": config.attention_logit_softcap,
        "final_logit_softcapping": config.final_logit_softcap,
        "query_pre_attn_scalar": config.attention_scale_dim or config.head_dim,
    }


def _not_a_later_gemma_block(config: LlamaConfig, generation: int) -> str | None:
    if not config.scale_embeddings:
        return "Gemma always scales its embeddings by sqrt(hidden_size)"
    if config.norm_placement != "both":
        return f"Gemma {generation} norms each sublayer's input and output (norm_placement='both')"
    if config.qkv_bias != config.o_bias:
        return "Gemma's attention_bias puts biases on q, k, v and the output projection alike"
    if config.qk_norm != (generation == 3):
        return "Gemma 3 always has per-head query/key norms, Gemma 2 never"
    if config.qk_norm_scope != "head":
        return "Gemma 3's query/key norms are per head (qk_norm_scope='head')"
    return None


_LATER_GEMMA_OPTIONS = {
    "head_dim_override", "qkv_bias", "o_bias", "activation", "scale_embeddings", "norm_placement", "sliding_window",
    "layer_types", "attention_logit_softcap", "final_logit_softcap", "attention_scale_dim",
}


def _later_gemma_layer_weights(config: LlamaConfig):
    return llama_layer_weights(config, GEMMA_NORM_OFFSET)


# -- Gemma 2 ------------------------------------------------------------------------------------------


def gemma2_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Gemma2ForCausalLM`` for ``config``."""
    return _later_gemma_config_dict(config, vocab_size, dtype, "Gemma2ForCausalLM", "gemma2")


def gemma2_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``Gemma2ForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "gemma2")
    theta, scaling = rope_from_hf(hf)
    fields = _later_gemma_fields(hf, 2, (GEMMA2_ATTENTION_SOFTCAP, GEMMA2_FINAL_SOFTCAP))
    return LlamaConfig(**fields, rope_theta=theta, rope_scaling=scaling), int(hf["vocab_size"])


def _gemma2_cannot_write(config: LlamaConfig) -> str | None:
    return _not_a_later_gemma_block(config, 2) or features_beyond(config, _LATER_GEMMA_OPTIONS | {"rope_scaling"})


GEMMA2 = HfFamily(
    "gemma2", LlamaLMHeadModel, LlamaDecoderLayer, _later_gemma_layer_weights, gemma2_config_dict, gemma2_config_from_hf,
    cannot_write=_gemma2_cannot_write, norm_offset=GEMMA_NORM_OFFSET,
)

# -- Gemma 3 (text) -----------------------------------------------------------------------------------


def _gemma3_rope_by_layer_type(hf: dict) -> dict[str, dict]:
    """Each kind of layer's RoPE parameters: transformers 5's ``rope_parameters`` per kind, or the
    older ``rope_theta`` + ``rope_scaling`` (full attention) and ``rope_local_base_freq`` (sliding)."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and params and set(params) <= set(LAYER_TYPES):
        return params
    if params:
        raise unsupported("rope_parameters", params, "Gemma 3 gives each kind of layer ('full_attention', 'sliding_attention') its own")
    full = {"rope_type": "default", **(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", GEMMA3_ROPE_THETA)}
    local = {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA)}
    return {"full_attention": full, "sliding_attention": local}


def _gemma3_rope(hf: dict) -> dict:
    """``rope_theta``, ``rope_scaling`` and ``sliding_rope_theta`` from ``config.json``."""
    by_type = _gemma3_rope_by_layer_type(hf)
    limits = {"max_position_embeddings": hf["max_position_embeddings"]}
    full = {"rope_theta": GEMMA3_ROPE_THETA, **(by_type.get("full_attention") or {})}
    theta, scaling = rope_from_hf({"rope_parameters": full, **limits})
    local = {"rope_theta": GEMMA3_LOCAL_ROPE_THETA, **(by_type.get("sliding_attention") or {})}
    local_theta, local_scaling = rope_from_hf({"rope_parameters": local, **limits})
    if local_scaling is not None:
        raise unsupported("rope_parameters.sliding_attention.rope_type", local_scaling.rope_type, "sliding layers use plain RoPE")
    return dict(rope_theta=theta, rope_scaling=scaling, sliding_rope_theta=local_theta)


def gemma3_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Gemma3ForCausalLM`` (``gemma3_text``) for ``config``."""
    hf = _later_gemma_config_dict(config, vocab_size, dtype, "Gemma3ForCausalLM", "gemma3_text")
    local_theta = config.sliding_rope_theta or config.rope_theta
    rope = {"full_attention": hf["rope_parameters"], "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}
    # rope_local_base_freq for transformers 4, which reads rope_theta and rope_scaling as the full layers'.
    return {**hf, "rope_parameters": rope, "rope_local_base_freq": local_theta}


def gemma3_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``Gemma3ForCausalLM`` (``gemma3_text``) ``config.json`` dict."""
    expect_model_type(hf, "gemma3_text")
    fields = _later_gemma_fields(hf, hf.get("sliding_window_pattern", GEMMA3_SLIDING_WINDOW_PATTERN), (None, None))
    rope = _gemma3_rope(hf)
    if "sliding_attention" not in fields["layer_types"]:
        rope["sliding_rope_theta"] = None  # no layer it would apply to
    return LlamaConfig(**fields, **rope, qk_norm=True), int(hf["vocab_size"])


def _gemma3_cannot_write(config: LlamaConfig) -> str | None:
    allowed = _LATER_GEMMA_OPTIONS | {"qk_norm", "rope_scaling", "sliding_rope_theta"}
    return _not_a_later_gemma_block(config, 3) or features_beyond(config, allowed)


GEMMA3 = HfFamily(
    "gemma3_text", LlamaLMHeadModel, LlamaDecoderLayer, _later_gemma_layer_weights, gemma3_config_dict, gemma3_config_from_hf,
    cannot_write=_gemma3_cannot_write, norm_offset=GEMMA_NORM_OFFSET,
)
