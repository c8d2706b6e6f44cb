"""Supervised fine-tuning: ``chat_dataset(...)`` declares conversations rendered with a chat template
and tokenized with an assistant-only loss mask; ``sft(...)`` is ``train_lm`` over such datasets.

A chat dataset's result is the same :class:`~marin.processing.tokenize.TokenizedDataset` that
``tokenized(...)`` gives, so ``train_lm(datasets={chat: 1.0})`` trains on it as it is; its caches
carry the loss mask, and the training loss is the mean cross-entropy over the assistant's tokens
only. The handle's identity covers the source, the tokenizer, the chat template (name and content
digest) and the settings; never where anything lives.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Unpack

from marin.execution.lazy import LazyStep
from marin.experiment.chat_inputs import RenderedDatasetOptions, rendered_dataset_step
from marin.experiment.train import train_lm
from marin.experiment.train_step import TrainConfigError
from marin.processing.chat import (
    ChatTokenizeConfig,
    run_chat_tokenize,
)

# Bumped when the chat tokenize step's output changes meaning, so old caches are never reused for it.
CHAT_STEP_VERSION = "1"
_CHAT_ATTRIBUTE = "chat"


def chat_dataset(
    name: str,
    source: str | os.PathLike[str] | LazyStep,
    tokenizer: str | os.PathLike[str] | LazyStep | Any,
    template: str | None = None,
    *,
    messages_field: str = "messages",
    **options: Unpack[RenderedDatasetOptions],
) -> LazyStep:
    """A lazy handle for the conversations of ``source`` tokenized for training on the assistant's replies.

    ``source``: jsonl (plain, .gz, .zst) or Parquet files (a file, folder, glob or URL), a Hugging
    Face dataset id, or a lazy step listing files per split, as for ``tokenized(...)``; each record
    has ``messages_field``, a list of ``{"role", "content"}`` messages. ``tokenizer``: as for
    ``tokenized(...)``. ``template``: None for the tokenizer's own chat template, or ``"chatml"``
    when it has none; a name from ``levanter.tokenization.chat.NAMED_TEMPLATES``; ``"tokenizer"``
    to require the tokenizer's own; or a Jinja template text. ``options``:
    :class:`~marin.experiment.chat_inputs.RenderedDatasetOptions` (``sample_count``, ``validation``,
    ``version``, ``num_shards``, ...). The artifact is a :class:`TokenizedDataset` whose caches
    carry the loss mask.
    """
    return rendered_dataset_step(
        "chat_dataset", name, source, tokenizer, template, config_type=ChatTokenizeConfig,
        fields={"messages_field": messages_field}, tokenize=run_chat_tokenize, attribute=_CHAT_ATTRIBUTE,
        format_version=CHAT_STEP_VERSION, **options,
    )


def is_chat_dataset(handle: Any) -> bool:
    """Whether ``handle`` was declared by :func:`chat_dataset`."""
    return isinstance(handle, LazyStep) and isinstance(handle.hash_attrs.get(_CHAT_ATTRIBUTE), ChatTokenizeConfig)


def sft(
    name: str,
    *,
    datasets: Mapping[LazyStep, float],
    model: Any = None,
    num_samples: int = 0,
    **train_options: Any,
) -> LazyStep:
    """Supervised fine-tuning: :func:`~marin.experiment.train.train_lm` over ``chat_dataset`` handles.

    Every dataset must be a chat dataset, so that the loss counts the assistant's tokens only (a
    plain ``tokenized`` dataset would train on every token). ``num_samples`` defaults to 0: the
    training step's sample prompts are story openings, not conversations. Every other argument
    (``batch_size``, ``seq_len``, ``num_train_steps``, ``optimizer``, ``initialize_from``, ...) is
    ``train_lm``'s; ``model`` may be left out when ``initialize_from`` says it.
    """
    plain = [handle.name if isinstance(handle, LazyStep) else repr(handle) for handle in datasets if not is_chat_dataset(handle)]
    if plain:
        raise TrainConfigError(
            f"sft trains on chat datasets only, so that the loss counts the assistant's tokens alone; "
            f"{', '.join(plain)} {'is' if len(plain) == 1 else 'are'} not. Declare them with "
            "chat_dataset(name, source=..., tokenizer=...), or use train_lm to train on every token."
        )
    return train_lm(name, model=model, datasets=datasets, num_samples=num_samples, **train_options)


__all__ = ["CHAT_STEP_VERSION", "chat_dataset", "is_chat_dataset", "sft"]
