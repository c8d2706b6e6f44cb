"""Preference training: ``preference_dataset(...)`` declares (prompt, chosen, rejected) records
tokenized as pairs; ``dpo(...)`` trains on them with direct preference optimisation.

A preference dataset's caches hold pairs of documents with a loss mask on the replies and say so
in their metadata (:mod:`marin.processing.preference`), so ``train_lm``/``sft`` refuse them and
``dpo`` accepts nothing else. ``dpo`` is a training step like ``train_lm`` (same outputs, same
record): the policy starts from ``initialize_from``, and the same weights, frozen, are the
reference model (:mod:`levanter.trainer.dpo`). ``lora=`` trains adapters instead of the weights;
the reference is then the frozen base itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Unpack

from levanter.trainer.dpo import DpoConfig

from marin.execution.lazy import LazyStep
from marin.experiment.chat_inputs import RenderedDatasetOptions, rendered_dataset_step
from marin.experiment.train import train_lm
from marin.experiment.train_step import TrainConfigError
from marin.processing.preference import (
    PreferenceTokenizeConfig,
    run_preference_tokenize,
)

PREFERENCE_STEP_VERSION = "1"
_PREFERENCE_ATTRIBUTE = "preference"


def preference_dataset(
    name: str,
    source: str | os.PathLike[str] | LazyStep,
    tokenizer: str | os.PathLike[str] | LazyStep | Any,
    template: str | None = None,
    *,
    prompt_field: str = "prompt",
    chosen_field: str = "chosen",
    rejected_field: str = "rejected",
    **options: Unpack[RenderedDatasetOptions],
) -> LazyStep:
    """A lazy handle for the preference pairs of ``source``, tokenized for :func:`dpo`.

    Each record has ``prompt`` (a string: one user message; or a list of ``{"role", "content"}``
    messages), ``chosen`` and ``rejected`` (a string: the assistant's reply; or a list of messages).
    ``source``, ``tokenizer``, ``template`` and the other options are as for ``chat_dataset(...)``.
    """
    return rendered_dataset_step(
        "preference_dataset", name, source, tokenizer, template, config_type=PreferenceTokenizeConfig,
        fields={"fields": (prompt_field, chosen_field, rejected_field)}, tokenize=run_preference_tokenize,
        attribute=_PREFERENCE_ATTRIBUTE, format_version=PREFERENCE_STEP_VERSION, **options,
    )


def is_preference_dataset(handle: Any) -> bool:
    """Whether ``handle`` was declared by :func:`preference_dataset`."""
    return isinstance(handle, LazyStep) and isinstance(handle.hash_attrs.get(_PREFERENCE_ATTRIBUTE), PreferenceTokenizeConfig)


def dpo(
    name: str,
    *,
    initialize_from: LazyStep | str | Any,
    datasets: Mapping[LazyStep, float],
    beta: float = 0.1,
    model: Any = None,
    num_samples: int = 0,
    **train_options: Any,
) -> LazyStep:
    """Direct preference optimisation of the model ``initialize_from`` names, on one ``preference_dataset``.

    ``initialize_from``: a ``train_lm``/``sft`` handle, a Hugging Face folder or model id, or a
    checkpoint folder: the policy's first weights and the frozen reference. ``beta``: DPO's
    temperature. ``batch_size`` counts rows, two per pair (it and ``microbatch_size`` must be even);
    ``seq_len`` is each row's padded length (longer pairs lose prompt tokens from the left; a
    reply that does not fit is refused). Every other argument is ``train_lm``'s, ``lora=`` included.
    """
    if initialize_from is None:
        raise TrainConfigError("dpo needs initialize_from=: the model to improve, which is also the frozen reference.")
    return train_lm(name, model=model, datasets=datasets, initialize_from=initialize_from, num_samples=num_samples,
                    dpo=DpoConfig(beta=beta), **train_options)


__all__ = ["PREFERENCE_STEP_VERSION", "dpo", "is_preference_dataset", "preference_dataset"]
