"""The model families that have a Hugging Face format, and export/import by family.

``export_to_hf`` picks the family from the model (its class, then what its config uses),
``import_from_hf`` from ``config.json``'s ``model_type``, so callers need not know which family
they hold. A new family is one module defining an :class:`~levanter.compat.hf_family.HfFamily`
and one entry in :data:`FAMILIES`.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp

from levanter.compat.hf_family import HfFamily, UnsupportedConfigError, read_checkpoint, write_checkpoint
from levanter.compat.hf_format import DEFAULT_MAX_SHARD_BYTES, HfFormatError, read_hf_config
from levanter.compat.hf_gemma import GEMMA, GEMMA2, GEMMA3, GEMMA3_MULTIMODAL_REFUSAL
from levanter.compat.hf_gpt2 import GPT2
from levanter.compat.hf_llama import LLAMA
from levanter.compat.hf_mistral import MISTRAL
from levanter.compat.hf_mixtral import MIXTRAL
from levanter.compat.hf_olmo import OLMO2, OLMO3
from levanter.compat.hf_qwen import QWEN2, QWEN3
from levanter.compat.hf_qwen_moe import QWEN2_MOE, QWEN3_MOE

# The first is what a config.json without a model_type is read as. For export, the first family
# of the model's class whose config.json can express the model's config is used: plain Llama
# configs are written as llama, a sliding window makes them mistral, and so on.
FAMILIES: tuple[HfFamily, ...] = (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA, MIXTRAL, OLMO2, OLMO3, GEMMA2, GEMMA3, QWEN3_MOE, QWEN2_MOE, GPT2)

# model_types we know and deliberately do not read, and why (the message names the config fields).
REFUSED_MODEL_TYPES: dict[str, str] = {"gemma3": GEMMA3_MULTIMODAL_REFUSAL}


def supported_families() -> tuple[HfFamily, ...]:
    return FAMILIES


def family_of_model(model: Any) -> HfFamily | None:
    """The family that exports ``model``: the first of its class that can express its config, or None."""
    return next((f for f in FAMILIES if isinstance(model, f.model_class) and f.cannot_write(model.config) is None), None)


def _no_family_error(model: Any) -> Exception:
    reasons = {f.model_type: f.cannot_write(model.config) for f in FAMILIES if isinstance(model, f.model_class)}
    if not reasons:
        names = ", ".join(sorted({f.model_class.__name__ for f in FAMILIES}))
        return TypeError(f"No Hugging Face export for {type(model).__name__}; supported: {names}.")
    detail = "; ".join(f"{model_type}: {why}" for model_type, why in reasons.items())
    return UnsupportedConfigError(f"No Hugging Face format can express this {type(model.config).__name__} ({detail}).")


def export_to_hf(model: Any, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` (Llama or MoE) as a Hugging Face checkpoint folder; returns the folder.

    ``MoeLMHeadModel`` becomes ``MixtralForCausalLM`` (``Qwen3MoeForCausalLM`` with query/key norms, ``Qwen2MoeForCausalLM`` with a shared expert); ``LlamaLMHeadModel`` becomes
    ``LlamaForCausalLM``, or the family its config's options belong to (``MistralForCausalLM`` with
    a sliding window, ``Qwen2ForCausalLM`` with q/k/v biases only, ``Qwen3ForCausalLM`` with
    query/key norms, ``GemmaForCausalLM`` with scaled embeddings, ``Olmo2ForCausalLM`` /
    ``Olmo3ForCausalLM`` with OLMo's output norms); ``Gpt2LMHeadModel`` becomes ``GPT2LMHeadModel``.
    ``tokenizer_dir_or_obj``: a ``tokenizers.Tokenizer`` (saved as ``tokenizer.json``) or a folder
    whose tokenizer files are copied. Weights are written in the model's (float32) parameter
    dtype: one ``model.safetensors``, or shards plus ``model.safetensors.index.json`` when they
    exceed ``max_shard_bytes``, the layout ``from_pretrained`` expects.
    """
    if _holds_adapters(model):
        raise HfFormatError(
            "This model holds low-rank adapters: levanter.lora.export_merged_to_hf writes it with the adapters "
            "merged into the weights, levanter.lora.export_peft_adapter writes the adapters as a PEFT folder."
        )
    family = family_of_model(model)
    if family is None:
        raise _no_family_error(model)
    return write_checkpoint(family, model, out_dir, tokenizer_dir_or_obj=tokenizer_dir_or_obj, max_shard_bytes=max_shard_bytes)


def _holds_adapters(model: Any) -> bool:
    """Whether any layer of ``model`` carries LoRA factors (found by their field, not by importing levanter.lora)."""
    return any(hasattr(node, "lora_a") for node in jax.tree_util.tree_leaves(model, is_leaf=lambda n: hasattr(n, "lora_a")))


def import_from_hf(path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False, dtype: Any = jnp.float32) -> Any:
    """Load a checkpoint folder (a local path or any URL) as our model of the family its ``config.json`` names.

    ``model_type`` ``llama`` (or none), ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2`` and ``gemma3_text`` give a
    ``LlamaLMHeadModel``, ``mixtral``, ``qwen3_moe`` and ``qwen2_moe`` a ``MoeLMHeadModel``.
    """
    model_type = read_hf_config(path).get("model_type") or FAMILIES[0].model_type
    families = {f.model_type: f for f in FAMILIES}
    if model_type in REFUSED_MODEL_TYPES:
        raise UnsupportedConfigError(f"{os.fspath(path)}: config.json model_type={model_type!r}: {REFUSED_MODEL_TYPES[model_type]}.")
    if model_type not in families:
        raise UnsupportedConfigError(
            f"{os.fspath(path)} holds a {model_type!r} model; supported model_types: {', '.join(families)}."
        )
    return read_checkpoint(families[model_type], path, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing, dtype=dtype)
