"""The model families that have a Hugging Face format, and export/import by family.

``export_to_hf`` picks the family from the model's class, ``import_from_hf`` from ``config.json``'s
``model_type``, so callers need not know which family they hold. A new family is one module
defining an :class:`~levanter.compat.hf_family.HfFamily` and one entry in :data:`FAMILIES`.
"""

from __future__ import annotations

import os
from typing import Any

import jax.numpy as jnp

from levanter.compat.hf_family import HfFamily, read_checkpoint, write_checkpoint
from levanter.compat.hf_format import DEFAULT_MAX_SHARD_BYTES, HfFormatError, read_hf_config
from levanter.compat.hf_llama import LLAMA
from levanter.compat.hf_mixtral import MIXTRAL

# The first is what a config.json without a model_type is read as.
FAMILIES: tuple[HfFamily, ...] = (LLAMA, MIXTRAL)


def supported_families() -> tuple[HfFamily, ...]:
    return FAMILIES


def family_of_model(model: Any) -> HfFamily | None:
    """The family that can export ``model``, or None when none can."""
    return next((f for f in FAMILIES if isinstance(model, f.model_class)), None)


def export_to_hf(model: Any, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` (Llama or MoE) as a Hugging Face checkpoint folder; returns the folder.

    ``LlamaLMHeadModel`` becomes ``LlamaForCausalLM``, ``MoeLMHeadModel`` ``MixtralForCausalLM``.
    ``tokenizer_dir_or_obj``: a ``tokenizers.Tokenizer`` (saved as ``tokenizer.json``) or a folder
    whose tokenizer files are copied. Weights are written in the model's (float32) parameter
    dtype: one ``model.safetensors``, or shards plus ``model.safetensors.index.json`` when they
    exceed ``max_shard_bytes``, the layout ``from_pretrained`` expects.
    """
    family = family_of_model(model)
    if family is None:
        names = ", ".join(f.model_class.__name__ for f in FAMILIES)
        raise TypeError(f"No Hugging Face export for {type(model).__name__}; supported: {names}.")
    return write_checkpoint(family, model, out_dir, tokenizer_dir_or_obj=tokenizer_dir_or_obj, max_shard_bytes=max_shard_bytes)


def import_from_hf(path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False, dtype: Any = jnp.float32) -> Any:
    """Load a checkpoint folder (a local path or any URL) as our model of the family its ``config.json`` names.

    ``model_type`` ``llama`` (or none) gives a ``LlamaLMHeadModel``, ``mixtral`` a ``MoeLMHeadModel``.
    """
    model_type = read_hf_config(path).get("model_type") or FAMILIES[0].model_type
    families = {f.model_type: f for f in FAMILIES}
    if model_type not in families:
        raise HfFormatError(f"{os.fspath(path)} holds a {model_type!r} model; supported model_types: {', '.join(families)}.")
    return read_checkpoint(families[model_type], path, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing, dtype=dtype)
