"""LoRA adapters as a PEFT adapter folder, and LoRA models as merged Hugging Face checkpoints.

A PEFT adapter folder holds ``adapter_config.json`` (``peft_type`` "LORA", rank, alpha, dropout,
target module names, the base model) and ``adapter_model.safetensors``, whose tensors are named
after the base model's state dict: ``base_model.model.<module>.lora_A.weight`` ``[r, in]`` and
``...lora_B.weight`` ``[out, r]``, where ``<module>`` is e.g. ``model.layers.3.self_attn.q_proj``.
``PeftModel.from_pretrained(base, folder)`` then adds the same update to the same projections.

Module names and layouts come from the model's Hugging Face family
(:mod:`levanter.compat.hf_family`), the same mapping the base checkpoint was written with, so the
adapter always addresses the modules of the checkpoint :func:`levanter.compat.hf_checkpoints.export_to_hf`
writes for the base model.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Iterator

import jax
import numpy as np

from haliax import Stacked
from levanter.compat.hf_format import create_folder, save_safetensors, write_json
from levanter.compat.hf_registry import export_to_hf, family_of_model
from levanter.lora.adapters import LoraError, LoraLinear, has_lora, merge_lora
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PeftModel wraps the Hugging Face model: its state dict is this + the model's


def _is_lora(x: Any) -> bool:
    return isinstance(x, LoraLinear)


def _adapters_in(layer: Any) -> dict[str, LoraLinear]:
    """The adapters of one layer (or of the stacked layers) by path inside it: ``"attention.q_proj"``."""
    found = jax.tree_util.tree_flatten_with_path(layer, is_leaf=_is_lora)[0]
    return {".".join(str(getattr(k, "name", k)) for k in path): leaf for path, leaf in found if _is_lora(leaf)}


def _adapters_by_layer(model: Any) -> list[dict[str, tuple[LoraLinear, jax.Array, jax.Array]]]:
    """For each layer, its adapters by path: the module and that layer's ``lora_a`` and ``lora_b``.

    Stacked layers are sliced adapter by adapter: unstacking whole layers would copy every base weight.
    """
    if isinstance(model.layers, Stacked):
        stacked = _adapters_in(model.layers.inner)
        return [{path: (lin, lin.lora_a[i], lin.lora_b[i]) for path, lin in stacked.items()} for i in range(model.layers.count)]
    return [{path: (lin, lin.lora_a, lin.lora_b) for path, lin in _adapters_in(layer).items()} for layer in model.layers]


def _hf_module_names(model: Any, adapters: dict[str, LoraLinear]) -> dict[str, str]:
    """Our path inside a layer -> the Hugging Face module path relative to ``model.layers.{i}.``.

    Refuses a projection the family does not write as one plain ``[out, in]`` linear weight, since
    PEFT's ``lora_A``/``lora_B`` could not address it.
    """
    family = family_of_model(model)
    if family is None:
        raise LoraError(f"{type(model).__name__} has no Hugging Face format, so its adapters have no PEFT names.")
    weights = {w.ours: w for w in family.layer_weights(model.config)}
    names = {}
    for path, adapter in adapters.items():
        n_in, n_out = len(adapter.base.in_axes), len(adapter.base.out_axes)
        shape = adapter.base.weight.shape[-(n_in + n_out):]  # one layer's, also when stacked
        # Only the name and layout the family gives this weight are wanted, so a zero-strided
        # stand-in of its shape (no memory) goes through the conversion instead of the weight.
        stand_in = np.broadcast_to(np.zeros((), np.float32), shape)
        weight = weights.get(f"{path}.weight")
        hf = list(weight.to_hf(stand_in)) if weight is not None else []
        expected = (math.prod(shape[n_in:]), math.prod(shape[:n_in]))
        if len(hf) != 1 or not hf[0][0].endswith(".weight") or hf[0][1].shape != expected:
            raise LoraError(f"{path} is not written as one [out, in] linear weight in the {family.model_type} format, "
                            "so a PEFT adapter cannot address it; merge_lora and export the merged model instead.")
        names[path] = hf[0][0].removesuffix(".weight")
    return names


def _one_setting(adapters: list[LoraLinear], name: str) -> Any:
    values = sorted({getattr(a, name) for a in adapters})
    if len(values) != 1:
        raise LoraError(f"The adapters differ in {name} ({values}); one adapter_config.json holds one value.")
    return values[0]


def _adapter_tensors(per_layer: list[dict[str, tuple[LoraLinear, jax.Array, jax.Array]]],
                    names: dict[str, str]) -> Iterator[tuple[str, np.ndarray]]:
    for i, adapters in enumerate(per_layer):
        for path, (_, lora_a, lora_b) in adapters.items():
            a = np.asarray(lora_a, dtype=np.float32)  # in_shape + (r,)
            b = np.asarray(lora_b, dtype=np.float32)  # (r,) + out_shape
            module = f"{PEFT_PREFIX}model.layers.{i}.{names[path]}"
            # Flattening keeps (heads, head_dim) in C order, as the base weights' export does.
            yield f"{module}.lora_A.weight", np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T)
            yield f"{module}.lora_B.weight", np.ascontiguousarray(b.reshape(b.shape[0], -1).T)


def export_peft_adapter(model: Any, out_dir: str | os.PathLike, *, base_model_name_or_path: str) -> str:
    """Write ``model``'s adapters as a PEFT LoRA adapter folder; returns the folder (a local path or any URL).

    ``base_model_name_or_path``: where the base model lives (a Hub name or the folder
    ``export_to_hf`` wrote for it), recorded for ``PeftModel`` and ``AutoPeftModelForCausalLM``.
    Tensors are written in float32 whatever the parameters' dtype; PEFT casts them on load.
    """
    if not has_lora(model):
        raise LoraError(f"This {type(model).__name__} has no LoRA adapters to export; apply_lora first.")
    per_layer = _adapters_by_layer(model)
    every = [adapter for layer in per_layer for adapter, _, _ in layer.values()]
    names = _hf_module_names(model, {path: adapter for path, (adapter, _, _) in per_layer[0].items()})
    if any(layer.keys() != names.keys() for layer in per_layer):
        raise LoraError("Layers carry adapters on different projections; PEFT's target_modules would apply them to all.")
    r, alpha, dropout = (_one_setting(every, name) for name in ("rank", "alpha", "dropout"))
    out_dir = os.fspath(out_dir)
    create_folder(out_dir)
    save_safetensors(dict(_adapter_tensors(per_layer, names)), fsx.join(out_dir, ADAPTER_WEIGHTS_FILE))
    write_json(fsx.join(out_dir, ADAPTER_CONFIG_FILE), {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": r,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "lora_dropout": dropout,
        # PEFT matches these against the ends of module names: "q_proj" is every layer's self_attn.q_proj.
        "target_modules": sorted({name.rsplit(".", 1)[-1] for name in names.values()}),
        "bias": "none",
        "fan_in_fan_out": False,  # lora_A / lora_B are [r, in] / [out, r], as torch.nn.Linear stores weights
        "use_rslora": False,  # the scale is alpha / r
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    })
    logger.info("Exported %d LoRA adapters (rank %d) to %s", len(every), r, out_dir)
    return out_dir


def export_merged_to_hf(model: Any, out_dir: str | os.PathLike, **kwargs: Any) -> str:
    """``merge_lora`` then ``export_to_hf`` (same keyword arguments): a checkpoint that needs no PEFT to load."""
    return export_to_hf(merge_lora(model), out_dir, **kwargs)
