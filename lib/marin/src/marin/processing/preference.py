"""The preference tokenize step: (prompt, chosen, rejected) records as pairs of masked documents.

Input: jsonl (plain, .gz, .zst) or Parquet records with ``prompt`` (a string, the user's message,
or a list of ``{"role", "content"}`` messages), ``chosen`` and ``rejected`` (a string, the
assistant's reply, or a list of messages that continue the prompt). Each record gives two
conversations, prompt + chosen and prompt + rejected, rendered and tokenized as the chat step does
(:mod:`levanter.tokenization.chat`); the loss mask is 1 on the reply's assistant tokens only, never
on assistant turns inside the prompt.

Output: ``<out>/<split>/`` token caches whose documents alternate chosen and rejected (document
``2i`` is record ``i``'s chosen conversation, ``2i + 1`` its rejected one), with
``"layout": PAIR_LAYOUT`` in their metadata (:mod:`levanter.data.pairs`): the text loader refuses
them, and only a preference objective reads them. The result is a
:class:`~marin.processing.tokenize.TokenizedDataset`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from levanter.data.pairs import PAIR_LAYOUT
from levanter.tokenization import (
    ChatRenderer,
    ChatTemplate,
    HfTokenizer,
    encode_conversations,
    load_tokenizer,
    resolve_chat_template,
)
from levanter.tokenization.chat import ConversationFormatError
from rigging import filesystem as fsx
from zephyr.readers import input_format, read_jsonl, read_parquet
from zephyr.token_cache import TokenCache
from zephyr.worker_context import count
from zephyr.writers import write_token_cache

from marin.processing.chat import describe_template
from marin.processing.tokenize import (
    MissingSplitError,
    TokenizedDataset,
    TokenizedSplit,
    TokenizeInputs,
    TokenizerChangedError,
    check_split_settings,
    encoding_pipeline,
    shard_files_backend,
)

logger = logging.getLogger(__name__)

# What the loss mask means; part of the hash.
PAIR_MASK_RULE = "reply-assistant-turns/1"
_BATCH = 256


@dataclass(frozen=True)
class PreferenceTokenizeConfig:
    """Everything that determines the pairs a preference tokenize step writes (its hash attributes)."""

    source: Mapping[str, Any]
    tokenizer: str | None
    template: Mapping[str, Any]
    splits: tuple[str, ...] = ("train",)
    sample_count: int | None = None
    fields: tuple[str, str, str] = ("prompt", "chosen", "rejected")
    num_shards: int | None = None
    mask_rule: str = PAIR_MASK_RULE
    layout: str = PAIR_LAYOUT

    def __post_init__(self) -> None:
        check_split_settings(self, "preference pairs")


@dataclass(frozen=True)
class RecordReader:
    """``flat_map`` function: every record of one jsonl or Parquet file as ``(where, record)``."""

    def __call__(self, path: str) -> Iterator[tuple[str, Any]]:
        kind, _ = input_format(path)
        records = read_parquet(path) if kind == "parquet" else read_jsonl(path)
        for number, record in enumerate(records, start=1):
            yield f"{path}, record {number}", record


def _messages(value: Any, role: str, what: str, where: str) -> list[Any]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and value:
        return list(value)
    raise ConversationFormatError(f"{where}: {what} must be a string or a non-empty list of messages, got {value!r:.60}.")


def _reply_only(mask: np.ndarray, reply_turns: int) -> np.ndarray:
    """``mask`` keeping only its last ``reply_turns`` runs of ones (the reply's assistant turns)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    starts, ends = edges[0::2], edges[1::2]
    kept = np.zeros_like(mask)
    for start, end in zip(starts[-reply_turns:], ends[-reply_turns:]):
        kept[start:end] = 1
    return kept


@dataclass(frozen=True)
class EncodePairShard:
    """``map_shard`` function: ``(where, record)`` in, two ``(ids, mask)`` documents out per record."""

    tokenizer: HfTokenizer
    template: ChatTemplate
    fields: tuple[str, str, str]

    def __call__(self, records: Iterator[tuple[str, Any]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        renderer = ChatRenderer.for_tokenizer(self.tokenizer, self.template)
        batch: list[tuple[str, Any]] = []
        for record in records:
            batch.append(record)
            if len(batch) >= _BATCH:
                yield from self._encode(renderer, batch)
                batch = []
        if batch:
            yield from self._encode(renderer, batch)

    def _encode(self, renderer: ChatRenderer, batch: list[tuple[str, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
        prompt_field, chosen_field, rejected_field = self.fields
        conversations, names, reply_turns = [], [], []
        for where, record in batch:
            if not isinstance(record, Mapping) or any(f not in record for f in self.fields):
                raise ConversationFormatError(f"{where}: a preference record needs the fields {list(self.fields)}, "
                                              f"got {sorted(record) if isinstance(record, Mapping) else type(record).__name__}.")
            prompt = _messages(record[prompt_field], "user", prompt_field, where)
            for field, label in ((chosen_field, "chosen"), (rejected_field, "rejected")):
                reply = _messages(record[field], "assistant", field, where)
                conversations.append(prompt + reply)
                names.append(f"{where} ({label})")
                reply_turns.append(sum(1 for m in reply if isinstance(m, Mapping) and m.get("role") == "assistant"))
        encoded = encode_conversations(self.tokenizer, renderer, conversations, names)
        out = []
        for (ids, mask), turns, name in zip(encoded, reply_turns, names):
            if turns == 0:
                raise ConversationFormatError(f"{name}: the reply has no assistant message to compare.")
            out.append((ids, _reply_only(mask, turns)))
        count("pairs", len(batch))
        count("tokens", sum(int(ids.size) for ids, _ in out))
        return out


def run_preference_tokenize(config: PreferenceTokenizeConfig, inputs: TokenizeInputs, output_path: str, *,
                            template: str | None = None, backend: Any = None) -> TokenizedDataset:
    """Tokenize every split's preference records into ``<output_path>/<split>`` pair caches; resumable."""
    tokenizer = load_tokenizer(inputs.tokenizer, revision=inputs.tokenizer_revision)
    if config.tokenizer is not None and tokenizer.identity != config.tokenizer:
        raise TokenizerChangedError(
            f"tokenizer {inputs.tokenizer!r} now has identity {tokenizer.identity}, but this step was defined with "
            f"{config.tokenizer}; define the step again (rerun the script) so its hash matches the tokenizer."
        )
    chat_template = resolve_chat_template(tokenizer, template)
    logger.info("preference tokenize: tokenizer %s, %s", inputs.tokenizer, describe_template(tokenizer, chat_template))
    splits: dict[str, TokenizedSplit] = {}
    for split in config.splits:
        files = list(inputs.split_files.get(split) or ())
        if not files:
            raise MissingSplitError(f"split {split!r} has no input files (inputs have: {', '.join(inputs.split_files) or 'none'})")
        cache_url = fsx.join(output_path, split)
        dataset, shards = encoding_pipeline(files, config.num_shards, config.sample_count, RecordReader(),
                                            EncodePairShard(tokenizer, chat_template, config.fields))
        metadata = {
            "split": split,
            "tokenizer": tokenizer.identity,
            "source": dict(config.source),
            "chat_template": chat_template.identity(),
            "mask_rule": config.mask_rule,
            "layout": config.layout,
            "bos_id": None,
            "eos_id": None,
        }
        write_token_cache(dataset, cache_url, vocab_size=tokenizer.vocab_size, metadata=metadata, loss_mask=True,
                          skip_existing=True, backend=backend if backend is not None else shard_files_backend(shards))
        cache = TokenCache.open(cache_url)
        logger.info("preference tokenize %s: %d pairs, %d tokens -> %s", split, cache.num_documents // 2, cache.num_tokens, cache_url)
        splits[split] = TokenizedSplit(cache_path=cache_url, documents=cache.num_documents, content_tokens=cache.num_tokens,
                                       tokens=cache.num_tokens)
    return TokenizedDataset(
        splits=splits,
        tokenizer_identity=tokenizer.identity,
        tokenizer_source=inputs.tokenizer,
        vocab_size=tokenizer.vocab_size,
        eos_id=None,
        bos_id=None,
        source=dict(config.source),
        builtin_source=inputs.builtin_source,
        builtin_tokenizer=inputs.builtin_tokenizer,
    )
