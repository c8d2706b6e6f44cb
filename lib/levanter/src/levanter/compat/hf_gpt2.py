"""GPT-2 checkpoints (``GPT2LMHeadModel``, ``model_type`` ``gpt2``) as our ``Gpt2LMHeadModel``.

The layout differs from the Llama-like families in three ways, all handled here:

- tensors live under ``transformer.`` (layers at ``transformer.h.{i}.``, the embeddings
  ``wte``/``wpe``, the final norm ``ln_f``); the published ``gpt2`` files leave the prefix out,
  and both spellings are read;
- projections are ``Conv1D`` modules whose weights are stored ``[in, out]``, as ours are, so
  nothing is transposed (heads are still split into their own dimension);
- queries, keys and values are one fused projection, ``attn.c_attn`` (``[hidden, 3 * hidden]``
  and its bias): it is split into our three on import and concatenated again on export.

Options that change what the model computes and that ours does not have are refused by name:
unscaled attention scores (``scale_attn_weights: false``), scores divided by the layer index
(``scale_attn_by_inverse_layer_idx``) and cross-attention (``add_cross_attention``).
``reorder_and_upcast_attn`` only computes the scores in float32, which ours always do at float32
and is accepted.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from levanter.compat.hf_family import HF_ACTIVATIONS, HfFamily, LayerWeight, activation_from_hf, renamed, unsupported
from levanter.compat.hf_llama import expect_model_type
from levanter.models.gpt2 import Gpt2Block, Gpt2Config, Gpt2LMHeadModel

# transformers' name for each of our activations in GPT-2 configs ("gelu_new" is GPT-2's own).
_ACTIVATION_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "silu": "silu"}
_QKV = ("q", "k", "v")
# Causal-mask buffers that older GPT-2 files carry; ours is computed.
_MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")


def _heads(ours: str, theirs: str, config: Gpt2Config) -> LayerWeight:
    """A projection into heads: ours ``[h, heads, d]`` <-> theirs ``[h, heads * d]`` (Conv1D)."""
    h, n, d = config.hidden_dim, config.num_heads, config.head_dim
    return renamed(ours, theirs, lambda w: w.reshape(h, n * d), lambda t: t.reshape(h, n, d))


def _flat(ours: str, theirs: str, config: Gpt2Config) -> LayerWeight:
    """A per-head bias: ours ``[heads, d]`` <-> theirs ``[heads * d]``."""
    return renamed(ours, theirs, lambda w: w.reshape(-1), lambda t: t.reshape(config.num_heads, config.head_dim))


def gpt2_layer_weights(config: Gpt2Config) -> list[LayerWeight]:
    """A block's weights; q/k/v under ``attn.c_attn.{q,k,v}``, the pieces of the fused tensor."""
    h = config.hidden_dim
    return [
        renamed("input_norm.weight", "ln_1.weight"),
        renamed("input_norm.bias", "ln_1.bias"),
        *(_heads(f"attention.{p}_proj.weight", f"attn.c_attn.{p}.weight", config) for p in _QKV),
        *(_flat(f"attention.{p}_bias.weight", f"attn.c_attn.{p}.bias", config) for p in _QKV),
        # ours [heads, d, h] <-> theirs [heads * d, h]
        renamed("attention.o_proj.weight", "attn.c_proj.weight", lambda w: w.reshape(-1, h),
                lambda t: t.reshape(config.num_heads, config.head_dim, h)),
        renamed("attention.o_bias.weight", "attn.c_proj.bias"),
        renamed("post_attention_norm.weight", "ln_2.weight"),
        renamed("post_attention_norm.bias", "ln_2.bias"),
        renamed("mlp.up_proj.weight", "mlp.c_fc.weight"),
        renamed("mlp.up_bias.weight", "mlp.c_fc.bias"),
        renamed("mlp.down_proj.weight", "mlp.c_proj.weight"),
        renamed("mlp.down_bias.weight", "mlp.c_proj.bias"),
    ]


def gpt2_outer_weights(config: Gpt2Config) -> list[LayerWeight]:
    return [
        renamed("embed.weight", "transformer.wte.weight"),
        renamed("position_embed.weight", "transformer.wpe.weight"),
        renamed("final_norm.weight", "transformer.ln_f.weight"),
        renamed("final_norm.bias", "transformer.ln_f.bias"),
    ]


def split_fused_qkv(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint names -> the names ``gpt2_layer_weights`` reads: the ``transformer.`` prefix
    added where the file leaves it out, each ``c_attn`` split into q, k, v, mask buffers dropped."""
    out = {}
    for name, tensor in tensors.items():
        if not name.startswith(("transformer.", "lm_head.")):
            name = f"transformer.{name}"
        if name.endswith(_MASK_BUFFERS):
            continue
        stem, _, kind = name.rpartition(".")
        if stem.endswith("attn.c_attn"):
            for p, part in zip(_QKV, np.split(tensor, 3, axis=-1), strict=True):
                out[f"{stem}.{p}.{kind}"] = part
        else:
            out[name] = tensor
    return out


def fuse_qkv(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One layer's tensors as GPT-2 stores them: the q, k, v pieces concatenated into ``c_attn``."""
    out = {name: t for name, t in tensors.items() if not name.startswith("attn.c_attn.")}
    for kind in ("weight", "bias"):
        out[f"attn.c_attn.{kind}"] = np.concatenate([tensors[f"attn.c_attn.{p}.{kind}"] for p in _QKV], axis=-1)
    return out


def gpt2_config_dict(config: Gpt2Config, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``GPT2LMHeadModel`` for ``config``."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": config.max_seq_len,
        "n_embd": config.hidden_dim,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": config.intermediate_dim,
        "activation_function": _ACTIVATION_TO_HF[config.activation],
        "layer_norm_epsilon": config.norm_eps,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_word_embeddings,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "torch_dtype": jnp.dtype(dtype).name,
    }


def standard_names(hf: dict) -> dict:
    """``config.json`` with GPT-2's shape fields also under the names the other families use."""
    hidden = hf.get("n_embd")
    return {"hidden_size": hidden, "num_hidden_layers": hf.get("n_layer"), "num_attention_heads": hf.get("n_head"),
            "intermediate_size": hf.get("n_inner") or (4 * hidden if isinstance(hidden, int) else None), **hf}


def gpt2_config_from_hf(hf: dict) -> tuple[Gpt2Config, int]:
    """Our config and the vocabulary size from a ``GPT2LMHeadModel`` ``config.json`` dict."""
    expect_model_type(hf, "gpt2")
    if not hf.get("scale_attn_weights", True):
        raise unsupported("scale_attn_weights", hf["scale_attn_weights"], "our attention divides scores by sqrt(head_dim)")
    for field, why in (("scale_attn_by_inverse_layer_idx", "every layer's scores are scaled alike"),
                       ("add_cross_attention", "our decoder has no encoder to attend to")):
        if hf.get(field):
            raise unsupported(field, hf[field], why)
    name = hf.get("activation_function") or "gelu_new"
    if name not in HF_ACTIVATIONS or HF_ACTIVATIONS[name] not in _ACTIVATION_TO_HF:
        raise unsupported("activation_function", name, f"the activations we implement are {sorted(HF_ACTIVATIONS)}")
    hf = standard_names(hf)
    config = Gpt2Config(
        hidden_dim=hf["hidden_size"],
        intermediate_dim=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        max_seq_len=hf.get("n_positions", 1024),
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        activation=activation_from_hf(hf, "activation_function", "gelu_new"),
    )
    return config, int(hf["vocab_size"])


GPT2 = HfFamily(
    "gpt2", Gpt2LMHeadModel, Gpt2Block, gpt2_layer_weights, gpt2_config_dict, gpt2_config_from_hf,
    canonical_names=split_fused_qkv, layer_prefix="transformer.h", outer_weights=gpt2_outer_weights,
    stored_layer_tensors=fuse_qkv, standard_config_names=standard_names,
)
