"""Llama checkpoints as Hugging Face ``LlamaForCausalLM`` folders.

``LlamaLMHeadModel`` is Hugging Face's Llama with the same names for the same things: a decoder
layer is the shared attention and norms (:func:`~levanter.compat.hf_family.attention_weights`)
plus a SwiGLU MLP whose three projections are plain linear maps.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import jax.numpy as jnp
import numpy as np

from levanter.compat.hf_family import (
    HfFamily,
    LayerWeight,
    attention_weights,
    decoder_config_dict,
    decoder_fields_from_hf,
    iter_family_tensors,
    read_checkpoint,
    transposed,
    write_checkpoint,
)
from levanter.compat.hf_format import DEFAULT_MAX_SHARD_BYTES, HfFormatError
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer, LlamaLMHeadModel


def _llama_layer_weights(config: LlamaConfig) -> list[LayerWeight]:
    return attention_weights(config) + [
        transposed("mlp.gate_proj.weight", "mlp.gate_proj.weight"),
        transposed("mlp.up_proj.weight", "mlp.up_proj.weight"),
        transposed("mlp.down_proj.weight", "mlp.down_proj.weight"),
    ]


def hf_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``LlamaForCausalLM`` for ``config``."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **decoder_config_dict(config, vocab_size, dtype), "mlp_bias": False}


def llama_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``LlamaForCausalLM`` ``config.json`` dict."""
    if hf.get("model_type") not in (None, "llama"):
        raise HfFormatError(f"Expected a Llama checkpoint (model_type 'llama'), got model_type {hf.get('model_type')!r}.")
    return LlamaConfig(**decoder_fields_from_hf(hf)), int(hf["vocab_size"])


LLAMA = HfFamily("llama", LlamaLMHeadModel, LlamaDecoderLayer, _llama_layer_weights, hf_config_dict, llama_config_from_hf)


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
