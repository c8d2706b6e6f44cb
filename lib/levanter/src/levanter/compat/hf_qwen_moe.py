"""Qwen3-MoE (``qwen3_moe``) and Qwen2-MoE (``qwen2_moe``) checkpoints as our ``MoeLMHeadModel``.

Both are Mixtral's routed SwiGLU experts (of size ``moe_intermediate_size``) behind Qwen attention,
with a router that takes the top-k of the softmax probabilities and renormalises them only with
``norm_topk_prob`` (``MoeConfig.renormalize_top_k``). Each adds options of the one MoE config, so
neither needs a block of its own:

- Qwen3-MoE: Qwen3's attention, an RMSNorm over each query and key head before RoPE
  (``qk_norm``), a ``head_dim`` of its own, ``attention_bias`` on q, k, v and the output
  projection alike.
- Qwen2-MoE: Qwen2's attention, biases on q, k and v (``qkv_bias``), and a shared expert, a SwiGLU
  MLP of ``shared_expert_intermediate_size`` every token passes through, scaled by
  ``sigmoid(shared_expert_gate x)`` (``shared_expert_dim``).

Exports use the per-expert names of the published checkpoints
(``model.layers.{i}.mlp.experts.{j}.gate_proj.weight``); imports also read the fused tensors recent
transformers keep in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj``
``[E, H, I]``).

Refused by name: dense MLP layers between the sparse ones (``decoder_sparse_step`` other than 1,
a non-empty ``mlp_only_layers``: our decoder's layers are all alike), sliding-window layers and
RoPE scaling. As for Mixtral, the load-balancing loss is ours (Switch, averaged over layers) with
the checkpoint's ``router_aux_loss_coef``.
"""

from __future__ import annotations

import re
from typing import Any

import jax.numpy as jnp
import numpy as np

from levanter.compat.hf_family import (
    HfFamily,
    LayerWeight,
    activation_from_hf,
    attention_bias_weights,
    attention_weights,
    decoder_config_dict,
    head_dim_from_hf,
    renamed,
    rope_from_hf,
    shape_fields_from_hf,
    transposed,
    unsupported,
)
from levanter.compat.hf_format import CorruptCheckpointError
from levanter.compat.hf_llama import expect_model_type
from levanter.compat.hf_mixtral import per_expert
from levanter.compat.hf_qwen import _refuse_sliding_layers
from levanter.models.moe import MoeConfig, MoeDecoderLayer, MoeLMHeadModel

# transformers' defaults, for config.json files that leave a field out.
QWEN3_MOE_DEFAULTS = {"num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": False, "router_aux_loss_coef": 0.001}
QWEN2_MOE_DEFAULTS = {"num_experts": 60, "num_experts_per_tok": 4, "norm_topk_prob": False, "router_aux_loss_coef": 0.001,
                      "qkv_bias": True, "shared_expert_intermediate_size": 5632}

DENSE_LAYERS_REFUSAL = "dense MLP layers among the MoE layers are not implemented (every layer of our MoE decoder routes)"


# -- what both share --------------------------------------------------------------------------------


def _qwen_moe_layer_weights(config: MoeConfig) -> list[LayerWeight]:
    weights = attention_weights(config)
    if config.qkv_bias:
        weights += attention_bias_weights(config)
    if config.o_bias:
        weights.append(renamed("attention.o_bias.weight", "self_attn.o_proj.bias"))
    if config.qk_norm:
        weights += [renamed("attention.q_norm.weight", "self_attn.q_norm.weight"),
                    renamed("attention.k_norm.weight", "self_attn.k_norm.weight")]
    experts = "mlp.experts.{j}"
    weights += [
        transposed("moe.router.weight", "mlp.gate.weight"),  # ours [h, experts], theirs [experts, h]
        per_expert("moe.gate_proj", f"{experts}.gate_proj.weight", config.num_experts),
        per_expert("moe.up_proj", f"{experts}.up_proj.weight", config.num_experts),
        per_expert("moe.down_proj", f"{experts}.down_proj.weight", config.num_experts),
    ]
    if config.shared_expert_dim:
        weights += [transposed(f"moe.shared_expert.{p}_proj.weight", f"mlp.shared_expert.{p}_proj.weight") for p in ("gate", "up", "down")]
        weights.append(transposed("moe.shared_expert_gate.weight", "mlp.shared_expert_gate.weight"))  # ours [h, 1], theirs [1, h]
    return weights


def _qwen_moe_config_dict(config: MoeConfig, vocab_size: int, dtype: Any, architecture: str, model_type: str) -> dict:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        **decoder_config_dict(config, vocab_size, dtype),
        "moe_intermediate_size": config.intermediate_dim,
        "num_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_token,
        "norm_topk_prob": config.renormalize_top_k,
        "router_aux_loss_coef": config.router_aux_loss_coef,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
        "use_sliding_window": False,
        "sliding_window": None,
    }


def _refuse_two_expert_counts(hf: dict) -> None:
    """config.json as written (before defaults): ``num_experts`` and its alias must not disagree."""
    if "num_local_experts" in hf and "num_experts" in hf and hf["num_experts"] != hf["num_local_experts"]:
        raise CorruptCheckpointError(
            f"config.json gives num_experts={hf['num_experts']!r} and num_local_experts={hf['num_local_experts']!r}, two "
            "names of one setting (transformers writes the second): which one is meant cannot be told; correct it.")


def _qwen_moe_fields_from_hf(hf: dict) -> dict:
    """The ``MoeConfig`` fields both families read the same way; refuses what we cannot express."""
    _refuse_sliding_layers(hf)
    # transformers writes num_experts as num_local_experts (an alias); published configs say num_experts.
    num_experts = hf.get("num_local_experts", hf["num_experts"])
    if hf.get("decoder_sparse_step", 1) != 1:
        raise unsupported("decoder_sparse_step", hf["decoder_sparse_step"], DENSE_LAYERS_REFUSAL)
    if hf.get("mlp_only_layers"):
        raise unsupported("mlp_only_layers", hf["mlp_only_layers"], DENSE_LAYERS_REFUSAL)
    if not num_experts:
        raise unsupported("num_experts", num_experts, f"a {hf['model_type']} model without experts is a dense Qwen model")
    theta, scaling = rope_from_hf(hf)
    if scaling is not None:
        field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
        raise unsupported(f"{field}.rope_type", scaling.rope_type, "MoeConfig has plain RoPE only")
    if activation_from_hf(hf) != "silu":
        raise unsupported("hidden_act", hf["hidden_act"], "the experts are SwiGLU (silu) only")
    return dict(
        **{**shape_fields_from_hf(hf), "intermediate_dim": hf["moe_intermediate_size"]},
        rope_theta=theta,
        num_experts=int(num_experts),
        num_experts_per_token=int(hf["num_experts_per_tok"]),
        router_aux_loss_coef=float(hf["router_aux_loss_coef"]),
        head_dim_override=head_dim_from_hf(hf),
        renormalize_top_k=bool(hf["norm_topk_prob"]),
    )


_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def canonical_qwen_moe_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rewrites transformers' fused expert tensors as the per-expert checkpoint names; other names pass
    through. ``gate_up_proj`` holds each expert's gate rows, then its up rows."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        match = _FUSED.match(name)
        if match is None:
            out[name] = tensor
            continue
        experts, kind = match.groups()
        half = tensor.shape[1] // 2
        for j in range(tensor.shape[0]):
            if kind == "gate_up_proj":
                out[f"{experts}.{j}.gate_proj.weight"] = tensor[j, :half]
                out[f"{experts}.{j}.up_proj.weight"] = tensor[j, half:]
            else:
                out[f"{experts}.{j}.down_proj.weight"] = tensor[j]
    return out


# -- Qwen3-MoE --------------------------------------------------------------------------------------


def qwen3_moe_config_dict(config: MoeConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Qwen3MoeForCausalLM`` for ``config``."""
    hf = _qwen_moe_config_dict(config, vocab_size, dtype, "Qwen3MoeForCausalLM", "qwen3_moe")
    return {**hf, "attention_bias": config.qkv_bias}


def qwen3_moe_config_from_hf(hf: dict) -> tuple[MoeConfig, int]:
    """Our config and the vocabulary size from a ``Qwen3MoeForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "qwen3_moe")
    _refuse_two_expert_counts(hf)
    hf = {**QWEN3_MOE_DEFAULTS, **hf}
    if hf.get("shared_expert_intermediate_size"):
        raise unsupported("shared_expert_intermediate_size", hf["shared_expert_intermediate_size"],
                          "Qwen3-MoE has no shared expert (Qwen2-MoE's is read as model_type qwen2_moe)")
    bias = bool(hf.get("attention_bias", False))
    return MoeConfig(**_qwen_moe_fields_from_hf(hf), qkv_bias=bias, o_bias=bias, qk_norm=True), int(hf["vocab_size"])


def _qwen3_moe_cannot_write(config: MoeConfig) -> str | None:
    if not config.qk_norm:
        return "Qwen3-MoE always has query/key norms"
    if config.qkv_bias != config.o_bias:
        return "Qwen3-MoE's attention_bias puts biases on q, k, v and the output projection alike"
    if config.shared_expert_dim:
        return "Qwen3-MoE has no shared expert"
    return None


QWEN3_MOE = HfFamily(
    "qwen3_moe", MoeLMHeadModel, MoeDecoderLayer, _qwen_moe_layer_weights, qwen3_moe_config_dict, qwen3_moe_config_from_hf,
    canonical_names=canonical_qwen_moe_names, cannot_write=_qwen3_moe_cannot_write,
)

# -- Qwen2-MoE --------------------------------------------------------------------------------------


def qwen2_moe_config_dict(config: MoeConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``Qwen2MoeForCausalLM`` for ``config``."""
    hf = _qwen_moe_config_dict(config, vocab_size, dtype, "Qwen2MoeForCausalLM", "qwen2_moe")
    del hf["attention_bias"]  # Qwen2-MoE says qkv_bias
    return {**hf, "qkv_bias": config.qkv_bias, "shared_expert_intermediate_size": config.shared_expert_dim}


def qwen2_moe_config_from_hf(hf: dict) -> tuple[MoeConfig, int]:
    """Our config and the vocabulary size from a ``Qwen2MoeForCausalLM`` ``config.json`` dict."""
    expect_model_type(hf, "qwen2_moe")
    _refuse_two_expert_counts(hf)
    hf = {**QWEN2_MOE_DEFAULTS, **hf}
    shared = hf["shared_expert_intermediate_size"]
    if not shared:
        raise unsupported("shared_expert_intermediate_size", shared, "Qwen2-MoE's shared expert must have a width")
    config = MoeConfig(**_qwen_moe_fields_from_hf(hf), qkv_bias=bool(hf["qkv_bias"]), shared_expert_dim=int(shared))
    return config, int(hf["vocab_size"])


def _qwen2_moe_cannot_write(config: MoeConfig) -> str | None:
    if not config.shared_expert_dim:
        return "Qwen2-MoE always has a shared expert"
    if config.qk_norm or config.o_bias:
        return "Qwen2-MoE's attention has neither query/key norms nor an output bias"
    return None


QWEN2_MOE = HfFamily(
    "qwen2_moe", MoeLMHeadModel, MoeDecoderLayer, _qwen_moe_layer_weights, qwen2_moe_config_dict, qwen2_moe_config_from_hf,
    canonical_names=canonical_qwen_moe_names, cannot_write=_qwen2_moe_cannot_write,
)
