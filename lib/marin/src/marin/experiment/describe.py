"""A training run's record in the words a person looks for first: the model's family, the optimizer
and its peak rates.

Works on records (the optimizer's ``OptimizerConfig.to_dict()``: what a training step hashes, keeps
in its result and ``marin explain`` shows), so the run summary, the model card and the web view,
which read records from disk, all describe a run the same way. Every field whose name ends in
``learning_rate`` is a peak rate (Muon's ``adam_learning_rate`` beside its own): the schedule only
ever scales them down from there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def peak_rates(record: Mapping[str, Any]) -> dict[str, float]:
    """``{"learning_rate": 6e-4, ...}``: every peak rate the record sets."""
    return {key: float(value) for key, value in record.items()
            if key.endswith("learning_rate") and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


def rates_text(record: Mapping[str, Any]) -> str:
    """``"6e-04"``, or ``"0.02 (adam_learning_rate 0.003)"`` for an optimizer with several."""
    rates = peak_rates(record)
    main = rates.pop("learning_rate", None)
    others = ", ".join(f"{key} {value:.3g}" for key, value in rates.items())
    if main is None:
        return others or "-"
    return f"{main:.3g}" + (f" ({others})" if others else "")


def describe_optimizer(record: Mapping[str, Any]) -> str:
    """``"adam, peak learning rate 0.0006, cosine schedule (warmup 0, down to 0x), weight decay 0.1"``."""
    rates = peak_rates(record)
    main = rates.pop("learning_rate", None)
    parts = [str(record.get("type") or "optimizer")]
    if main is not None:
        parts.append(f"peak learning rate {main:.3g}")
    parts += [f"{key} {value:.3g}" for key, value in rates.items()]
    if record.get("lr_schedule"):
        warmup, floor = record.get("warmup") or 0, record.get("min_lr_ratio") or 0
        parts.append(f"{record['lr_schedule']} schedule (warmup {warmup:g}, down to {floor:g}x)")
    if isinstance(record.get("weight_decay"), (int, float)):
        parts.append(f"weight decay {record['weight_decay']:g}")
    return ", ".join(parts)


def model_family(model_type: str, architecture: str | None) -> str:
    """What a person calls the model: the export's architecture (``Olmo2`` for ``Olmo2ForCausalLM``:
    a Llama config with OLMo 2's norms), else our config's class (``Llama`` for ``LlamaConfig``)."""
    if architecture:
        return architecture.removesuffix("ForCausalLM").removesuffix("LMHeadModel")
    return model_type.removesuffix("Config")
