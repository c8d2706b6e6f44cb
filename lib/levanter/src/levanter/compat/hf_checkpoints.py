"""Decoder checkpoints in the Hugging Face format: ``config.json`` + safetensors (+ tokenizer files).

The public face of these modules, each with one job:

- :mod:`levanter.compat.hf_format`: the folder's files (sharded safetensors, ``config.json``,
  tokenizer files), on local paths or any URL, and the refusal of damaged ones.
- :mod:`levanter.compat.hf_tokenizer_files`: the tokenizer's metadata an export writes
  (``tokenizer_config.json``, ``special_tokens_map.json``, ``generation_config.json``), so other
  tools load the folder as it is.
- :mod:`levanter.compat.hf_family`: what a family is (our model class, its Hugging Face
  counterpart, how each weight maps), the weights every family shares, whole-model conversion, and
  the refusal of configs a family cannot express (:class:`UnsupportedConfigError`).
- :mod:`levanter.compat.hf_llama`, :mod:`~levanter.compat.hf_mistral`, :mod:`~levanter.compat.hf_qwen`,
  :mod:`~levanter.compat.hf_gemma`, :mod:`~levanter.compat.hf_mixtral`: one family each.
- :mod:`levanter.compat.hf_registry`: the list of families; ``export_to_hf`` / ``import_from_hf``
  pick one from the model or from ``config.json``'s ``model_type``, so callers need not know it.
"""

from levanter.compat.hf_family import (
    HfFamily,
    UnsupportedConfigError,
    LayerWeight,
    attention_weights,
    decoder_config_dict,
    decoder_fields_from_hf,
    iter_family_tensors,
    read_checkpoint,
    renamed,
    transposed,
    write_checkpoint,
)
from levanter.compat.hf_format import (
    DEFAULT_MAX_SHARD_BYTES,
    INDEX_FILE,
    REQUIRED_CONFIG_FIELDS,
    TOKENIZER_FILES,
    WEIGHTS_FILE,
    CorruptCheckpointError,
    HfFormatError,
    read_hf_config,
)
from levanter.compat.hf_llama import (
    LLAMA,
    export_llama_to_hf,
    hf_config_dict,
    import_llama_from_hf,
    iter_hf_tensors,
    llama_config_from_hf,
    llama_to_hf_tensors,
)
from levanter.compat.hf_mixtral import MIXTRAL, export_moe_to_hf, import_moe_from_hf, mixtral_config_dict
from levanter.compat.hf_registry import FAMILIES, export_to_hf, family_of_model, import_from_hf, supported_families

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "FAMILIES",
    "INDEX_FILE",
    "LLAMA",
    "MIXTRAL",
    "REQUIRED_CONFIG_FIELDS",
    "TOKENIZER_FILES",
    "WEIGHTS_FILE",
    "CorruptCheckpointError",
    "HfFamily",
    "HfFormatError",
    "UnsupportedConfigError",
    "LayerWeight",
    "attention_weights",
    "decoder_config_dict",
    "decoder_fields_from_hf",
    "export_llama_to_hf",
    "export_moe_to_hf",
    "export_to_hf",
    "family_of_model",
    "hf_config_dict",
    "import_from_hf",
    "import_llama_from_hf",
    "import_moe_from_hf",
    "iter_family_tensors",
    "iter_hf_tensors",
    "llama_config_from_hf",
    "llama_to_hf_tensors",
    "mixtral_config_dict",
    "read_checkpoint",
    "read_hf_config",
    "renamed",
    "supported_families",
    "transposed",
    "write_checkpoint",
]
