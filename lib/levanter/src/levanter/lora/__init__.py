"""Low-rank adapters (LoRA): fine-tune a few small matrices beside frozen projections.

- :mod:`levanter.lora.adapters`: :class:`LoraConfig`, the adapted linear layer, and what is done
  to a whole model: :func:`apply_lora`, :func:`lora_trainable_filter`, :func:`merge_lora`,
  :func:`with_lora_dropout`, :func:`count_trainable_parameters`.
- :mod:`levanter.lora.peft_format`: the adapters as a PEFT adapter folder
  (:func:`export_peft_adapter`), or the merged model as a Hugging Face checkpoint
  (:func:`export_merged_to_hf`).
"""

from levanter.lora.adapters import (
    LORA_RANK,
    LoraConfig,
    LoraError,
    LoraLinear,
    apply_lora,
    count_trainable_parameters,
    has_lora,
    lora_trainable_filter,
    merge_lora,
    projection_names,
    with_lora_dropout,
)
from levanter.lora.peft_format import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, export_merged_to_hf, export_peft_adapter

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_WEIGHTS_FILE",
    "LORA_RANK",
    "LoraConfig",
    "LoraError",
    "LoraLinear",
    "apply_lora",
    "count_trainable_parameters",
    "export_merged_to_hf",
    "export_peft_adapter",
    "has_lora",
    "lora_trainable_filter",
    "merge_lora",
    "projection_names",
    "with_lora_dropout",
]
