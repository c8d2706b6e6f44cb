"""MoE checkpoints as Hugging Face ``MixtralForCausalLM`` folders.

``MoeLMHeadModel`` routes exactly as Mixtral does: router logits, softmax in float32, top-k,
top-k weights renormalised to sum to 1, SwiGLU experts ``w2(silu(w1 x) * w3 x)``. So an export
needs no approximation; only layout changes: our stacked ``gate_proj``/``up_proj`` ``[experts, in,
out]`` become one ``w1``/``w3`` ``[out, in]`` per expert, ``down_proj`` becomes ``w2``.

Exports use the per-expert names of the published Mixtral checkpoints
(``model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight``), which every transformers version
loads (recent ones fuse them into ``mlp.experts.gate_up_proj`` on load). Imports read either
spelling. Mixtral's sliding-window attention is refused unless the window covers the whole
context, since our attention is fully causal.

What is not carried over: the load-balancing loss. Ours is the Switch loss averaged over layers;
transformers' Mixtral computes its own (``num_experts_per_tok`` times larger, pooled over layers)
from the same ``router_aux_loss_coef``. It matters only when training in transformers.
"""

from __future__ import annotations

import os
import re
from typing import Any

import jax.numpy as jnp
import numpy as np

from levanter.compat.hf_family import (
    HfFamily,
    LayerWeight,
    attention_weights,
    decoder_config_dict,
    decoder_fields_from_hf,
    read_checkpoint,
    transposed,
    unsupported,
    write_checkpoint,
)
from levanter.compat.hf_format import DEFAULT_MAX_SHARD_BYTES, HfFormatError
from levanter.models.moe import MoeConfig, MoeDecoderLayer, MoeLMHeadModel

MOE_BLOCK = "block_sparse_moe"
# transformers' own default when a Mixtral config.json does not say (Mixtral-8x7B uses 1e6).
MIXTRAL_DEFAULT_ROPE_THETA = 1_000_000.0


def per_expert(ours: str, theirs: str, num_experts: int) -> LayerWeight:
    """Ours ``[experts, in, out]`` <-> one HF ``[out, in]`` tensor per expert (``theirs`` has ``{j}``)."""

    def to_hf(w: np.ndarray):
        return ((theirs.format(j=j), w[j].T) for j in range(num_experts))

    def from_hf(take):
        return np.stack([take(theirs.format(j=j)).T for j in range(num_experts)])

    return LayerWeight(ours, to_hf, from_hf)


def _mixtral_layer_weights(config: MoeConfig) -> list[LayerWeight]:
    experts = f"{MOE_BLOCK}.experts.{{j}}"
    return attention_weights(config) + [
        transposed("moe.router.weight", f"{MOE_BLOCK}.gate.weight"),  # ours [h, experts], theirs [experts, h]
        per_expert("moe.gate_proj", f"{experts}.w1.weight", config.num_experts),
        per_expert("moe.up_proj", f"{experts}.w3.weight", config.num_experts),
        per_expert("moe.down_proj", f"{experts}.w2.weight", config.num_experts),
    ]


def mixtral_config_dict(config: MoeConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``MixtralForCausalLM`` for ``config``."""
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        **decoder_config_dict(config, vocab_size, dtype),
        "num_local_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_token,
        "router_aux_loss_coef": config.router_aux_loss_coef,
        "router_jitter_noise": 0.0,
        "output_router_logits": False,
        "sliding_window": None,
    }


def moe_config_from_hf(hf: dict) -> tuple[MoeConfig, int]:
    """Our config and the vocabulary size from a ``MixtralForCausalLM`` ``config.json`` dict."""
    if hf.get("model_type") != "mixtral":
        raise HfFormatError(f"Expected a Mixtral checkpoint (model_type 'mixtral'), got model_type {hf.get('model_type')!r}.")
    fields = decoder_fields_from_hf(hf, default_rope_theta=MIXTRAL_DEFAULT_ROPE_THETA)
    window = hf.get("sliding_window")
    if window is not None and window < fields["max_seq_len"]:
        raise unsupported(
            "sliding_window", window,
            f"it is shorter than max_position_embeddings={fields['max_seq_len']} and our MoE attention is fully causal "
            "(set sliding_window to null if the model was trained without one)",
        )
    config = MoeConfig(
        **fields,
        num_experts=int(hf.get("num_local_experts", 8)),
        num_experts_per_token=int(hf.get("num_experts_per_tok", 2)),
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)),
    )
    return config, int(hf["vocab_size"])


_FUSED = re.compile(r"^(model\.layers\.\d+)\.mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)$")


def canonical_mixtral_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rewrites the fused spelling recent transformers use in memory (``mlp.gate.weight``,
    ``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``) as the per-expert
    checkpoint names; other names pass through. The splits are views, not copies."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        match = _FUSED.match(name)
        if match is None:
            out[name] = tensor
            continue
        layer, kind = match.groups()
        if kind == "gate.weight":
            out[f"{layer}.{MOE_BLOCK}.gate.weight"] = tensor
        elif kind == "experts.gate_up_proj":
            # transformers concatenates gate (w1) then up (w3) along dim 1 and splits them in that order.
            half = tensor.shape[1] // 2
            for j in range(tensor.shape[0]):
                out[f"{layer}.{MOE_BLOCK}.experts.{j}.w1.weight"] = tensor[j, :half]
                out[f"{layer}.{MOE_BLOCK}.experts.{j}.w3.weight"] = tensor[j, half:]
        else:
            for j in range(tensor.shape[0]):
                out[f"{layer}.{MOE_BLOCK}.experts.{j}.w2.weight"] = tensor[j]
    return out


def _mixtral_cannot_write(config: MoeConfig) -> str | None:
    """Mixtral's attention is Llama's and its router always renormalises the top-k weights."""
    used = {
        "head_dim_override": config.head_dim_override is not None, "qkv_bias": config.qkv_bias, "o_bias": config.o_bias,
        "qk_norm": config.qk_norm, "renormalize_top_k=False": not config.renormalize_top_k,
        "shared_expert_dim": bool(config.shared_expert_dim),
    }
    extra = [name for name, on in used.items() if on]
    return f"it has no place for {', '.join(extra)}" if extra else None


MIXTRAL = HfFamily(
    "mixtral", MoeLMHeadModel, MoeDecoderLayer, _mixtral_layer_weights, mixtral_config_dict, moe_config_from_hf,
    canonical_names=canonical_mixtral_names, cannot_write=_mixtral_cannot_write,
)


def export_moe_to_hf(model: MoeLMHeadModel, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                     max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` as a ``MixtralForCausalLM`` checkpoint folder; returns the folder (see ``export_to_hf``)."""
    return write_checkpoint(MIXTRAL, model, out_dir, tokenizer_dir_or_obj=tokenizer_dir_or_obj, max_shard_bytes=max_shard_bytes)


def import_moe_from_hf(path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False, dtype: Any = jnp.float32) -> MoeLMHeadModel:
    """Load a local ``MixtralForCausalLM`` checkpoint folder (config.json + safetensors) as our model."""
    return read_checkpoint(MIXTRAL, path, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing, dtype=dtype)
