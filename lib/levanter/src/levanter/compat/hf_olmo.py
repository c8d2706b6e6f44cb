"""OLMo 2 (``olmo2``) and OLMo 3 (``olmo3``) checkpoints as our Llama.

OLMo 2 is Llama's decoder with two changes, both options of ``LlamaConfig``:

- each sublayer's RMSNorm is applied to its output, before the residual add, instead of to its
  input (``norm_placement="post"``; transformers' ``post_attention_layernorm`` and
  ``post_feedforward_layernorm``), and there is no input norm;
- an RMSNorm of the whole query and key projections, all heads together, after the projection
  and before RoPE (``qk_norm=True, qk_norm_scope="projection"``; weight ``[heads * head_dim]``).

``attention_bias`` puts biases on q, k, v and the output projection alike.

OLMo 3 is OLMo 2's block with sliding-window attention in some layers (``layer_types``, by
default three sliding layers then one full, and ``sliding_window``), which ``LlamaConfig`` holds
as the same two fields. transformers gives each kind of layer its own RoPE parameters: the
full-attention layers' become ``rope_theta`` and ``rope_scaling``, and sliding layers with a plain
RoPE of another base (or unscaled where the full layers are scaled) get ``sliding_rope_theta``.
Rescaled sliding layers cannot be expressed. The published OLMo 3 models extend their context
with ``yarn``, a RoPE type we do not implement, and are refused for that reason.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from levanter.compat.hf_family import (
    HfFamily,
    UnsupportedConfigError,
    layer_types_from_hf,
    rope_from_hf,
    rope_parameters,
    unsupported,
)
from levanter.compat.hf_llama import (
    expect_model_type,
    features_beyond,
    llama_layer_weights,
    llama_like_config_dict,
    llama_like_fields_from_hf,
)
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer, LlamaLMHeadModel
from levanter.models.transformer import LAYER_TYPES

# What every OLMo 2 and 3 layer has.
OLMO_BLOCK = dict(norm_placement="post", qk_norm=True, qk_norm_scope="projection")
# transformers' OLMo 3 default RoPE base, used when config.json gives none.
OLMO3_ROPE_THETA = 500_000.0


def _olmo_fields(hf: dict) -> dict:
    bias = bool(hf.get("attention_bias", False))
    return dict(**llama_like_fields_from_hf(hf), **OLMO_BLOCK, qkv_bias=bias, o_bias=bias)


def _olmo_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any, architecture: str, model_type: str) -> dict:
    return {**llama_like_config_dict(config, vocab_size, dtype, architecture, model_type), "attention_bias": config.qkv_bias}


def _not_an_olmo_block(config: LlamaConfig) -> str | None:
    if config.norm_placement != "post":
        return "OLMo norms each sublayer's output only (norm_placement='post')"
    if not config.qk_norm or config.qk_norm_scope != "projection":
        return "OLMo always norms the whole query and key projections (qk_norm_scope='projection')"
    if config.qkv_bias != config.o_bias:
        return "OLMo's attention_bias puts biases on q, k, v and the output projection alike"
    return None


# -- OLMo 2 ------------------------------------------------------------------------------------------


def olmo2_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Olmo2ForCausalLM`` for ``config``."""
    return _olmo_config_dict(config, vocab_size, dtype, "Olmo2ForCausalLM", "olmo2")


def olmo2_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from an ``Olmo2ForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "olmo2")
    return LlamaConfig(**_olmo_fields(hf)), int(hf["vocab_size"])


def _olmo2_cannot_write(config: LlamaConfig) -> str | None:
    allowed = {"head_dim_override", "rope_scaling", "qkv_bias", "o_bias", "qk_norm", "qk_norm_scope", "norm_placement", "activation"}
    return _not_an_olmo_block(config) or features_beyond(config, allowed)


OLMO2 = HfFamily(
    "olmo2", LlamaLMHeadModel, LlamaDecoderLayer, llama_layer_weights, olmo2_config_dict, olmo2_config_from_hf,
    cannot_write=_olmo2_cannot_write,
)

# -- OLMo 3 ------------------------------------------------------------------------------------------


def _rope_by_layer_type(hf: dict) -> dict[str, dict]:
    """Each kind of layer's RoPE parameters, from transformers 5's per-type ``rope_parameters`` or
    from the older ``rope_theta`` + ``rope_scaling``, where the scaling applies to full attention only."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and set(params) & set(LAYER_TYPES):  # (transformers reads only these keys then)
        return {kind: params[kind] for kind in LAYER_TYPES if kind in params}
    if params:  # one set of parameters for every layer
        return {kind: params for kind in LAYER_TYPES}
    theta = hf.get("rope_theta", OLMO3_ROPE_THETA)
    full = {"rope_type": "default", **(hf.get("rope_scaling") or {}), "rope_theta": theta}
    return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": theta}}


def _olmo3_rope(hf: dict, layer_types: tuple[str, ...]) -> dict:
    """``rope_theta``, ``rope_scaling`` and ``sliding_rope_theta`` for each kind of layer's RoPE."""
    by_type = _rope_by_layer_type(hf)
    readings = {}
    for kind in sorted(set(layer_types)):
        params = {"rope_theta": OLMO3_ROPE_THETA, **(by_type.get(kind) or {})}
        try:
            readings[kind] = rope_from_hf({"rope_parameters": params, "max_position_embeddings": hf["max_position_embeddings"]})
        except UnsupportedConfigError as e:
            raise UnsupportedConfigError(f"{e} (the {kind} layers' RoPE, in rope_parameters.{kind})") from None
    if len(set(readings.values())) == 1:
        theta, scaling = next(iter(readings.values()))
        return dict(rope_theta=theta, rope_scaling=scaling)
    (full_theta, full_scaling), (sliding_theta, sliding_scaling) = readings["full_attention"], readings["sliding_attention"]
    if sliding_scaling is not None:
        raise unsupported("rope_parameters.sliding_attention", by_type["sliding_attention"],
                          "sliding-window layers of their own RoPE rotate by plain (unscaled) RoPE here")
    return dict(rope_theta=full_theta, rope_scaling=full_scaling, sliding_rope_theta=sliding_theta)


def olmo3_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Olmo3ForCausalLM`` for ``config``."""
    hf = _olmo_config_dict(config, vocab_size, dtype, "Olmo3ForCausalLM", "olmo3")
    hf.pop("rope_scaling", None)  # transformers would apply it to the full-attention layers only
    full = rope_parameters(config)
    sliding = full if config.sliding_rope_theta is None else {"rope_type": "default", "rope_theta": config.sliding_rope_theta}
    kinds = ["sliding_attention" if config.window_of(i) is not None else "full_attention" for i in range(config.num_layers)]
    return {**hf, "rope_parameters": {"full_attention": full, "sliding_attention": dict(sliding)},
            "sliding_window": config.sliding_window, "layer_types": kinds}


def olmo3_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from an ``Olmo3ForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "olmo3")
    layer_types = layer_types_from_hf(hf, 4)  # OLMo 3: every fourth layer full
    rope = _olmo3_rope(hf, layer_types)
    window = hf.get("sliding_window", 4096)  # transformers' default
    if "sliding_attention" in layer_types and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise unsupported("sliding_window", window, "sliding_attention layers need a positive number of positions")
    # The shared fields without RoPE (read above, per kind of layer).
    fields = _olmo_fields({**hf, "rope_parameters": None, "rope_scaling": None})
    config = LlamaConfig(**{**fields, **rope}, sliding_window=window, layer_types=layer_types)
    return config, int(hf["vocab_size"])


def _olmo3_cannot_write(config: LlamaConfig) -> str | None:
    allowed = {"head_dim_override", "rope_scaling", "qkv_bias", "o_bias", "qk_norm", "qk_norm_scope", "norm_placement",
               "activation", "sliding_window", "layer_types", "sliding_rope_theta"}
    return _not_an_olmo_block(config) or features_beyond(config, allowed)


OLMO3 = HfFamily(
    "olmo3", LlamaLMHeadModel, LlamaDecoderLayer, llama_layer_weights, olmo3_config_dict, olmo3_config_from_hf,
    cannot_write=_olmo3_cannot_write,
)
