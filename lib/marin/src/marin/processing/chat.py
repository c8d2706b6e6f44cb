"""The chat tokenize step: conversations rendered with a chat template, tokenized into token caches
whose loss mask is 1 exactly on the assistant's tokens.

Input: jsonl (plain, .gz, .zst) or Parquet records, each with a ``messages`` field holding a list of
``{"role": "system" | "user" | "assistant", "content": str}``. Each conversation is rendered with
the chat template (the tokenizer's own, or a named default such as ``chatml`` for a tokenizer that
has none) and tokenized; how the assistant's tokens are found, and when a conversation is refused,
is :mod:`levanter.tokenization.chat`. Every error names the record (file and line or row).

Output: the same layout and result type as the plain tokenize step (``<out>/<split>/`` token
caches, a :class:`~marin.processing.tokenize.TokenizedDataset`), so ``train_lm`` trains on it
unchanged; the caches carry a loss mask (format ``marin-token-cache/3``, see
``zephyr.token_cache``) that the training loader turns into ``Batch.loss_mask``. No BOS or EOS is
added around a conversation: the template decides what wraps it, and packed conversations are
kept apart by per-document attention.

What goes into the hash is :class:`ChatTokenizeConfig`: the source's and tokenizer's identities,
and the template's name and content digest (a tokenizer's ``tokenizer.json`` digest does not cover
its chat template, which lives in ``tokenizer_config.json``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from levanter.tokenization import (
    ChatRenderer,
    ChatTemplate,
    HfTokenizer,
    encode_conversations,
    load_tokenizer,
    resolve_chat_template,
)
from rigging import filesystem as fsx
from zephyr.readers import FieldReader
from zephyr.token_cache import TokenCache
from zephyr.worker_context import count
from zephyr.writers import write_token_cache

from marin.processing.tokenize import (
    MissingSplitError,
    RateMeter,
    TokenizedDataset,
    TokenizedSplit,
    TokenizeInputs,
    TokenizerChangedError,
    check_split_settings,
    describe_source,
    encoding_pipeline,
    shard_files_backend,
)

logger = logging.getLogger(__name__)

# What the loss mask means; part of the hash, so a change of rule never reuses old caches.
MASK_RULE = "assistant-turns/1"
# Conversations are rendered, checked and handed to the tokenizer this many at a time.
ENCODE_BATCH_CONVERSATIONS = 512
# The loss mask is summed for the log this many tokens at a time (bounded memory for any cache).
_COUNT_CHUNK_TOKENS = 1 << 24


@dataclass(frozen=True)
class ChatTokenizeConfig:
    """Everything that determines the tokens and masks a chat tokenize step writes (its hash attributes).

    ``template``: the chat template's identity, ``{"name": ..., "digest": "sha256:..."}``; when the
    tokenizer is built by a dependency step (so not known yet), what was asked for,
    ``{"requested": None | name | digest of a Jinja text}``, the tokenizer step's identity covering
    the rest.
    """

    source: Mapping[str, Any]
    tokenizer: str | None
    template: Mapping[str, Any]
    splits: tuple[str, ...] = ("train",)
    sample_count: int | None = None
    messages_field: str = "messages"
    num_shards: int | None = None
    mask_rule: str = MASK_RULE

    def __post_init__(self) -> None:
        check_split_settings(self, "conversations")


@dataclass(frozen=True)
class EncodeConversationShard:
    """``map_shard`` function: ``(where, messages)`` records in, ``(token ids, loss mask)`` pairs out."""

    tokenizer: HfTokenizer
    template: ChatTemplate
    batch_size: int = ENCODE_BATCH_CONVERSATIONS

    def __call__(self, records: Iterator[tuple[str, Any]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        renderer = ChatRenderer.for_tokenizer(self.tokenizer, self.template)
        meter = RateMeter()
        batch: list[tuple[str, Any]] = []
        for record in records:
            batch.append(record)
            if len(batch) >= self.batch_size:
                yield from self._encode(renderer, batch, meter)
                batch = []
        if batch:
            yield from self._encode(renderer, batch, meter)

    def _encode(self, renderer: ChatRenderer, batch: list[tuple[str, Any]], meter: RateMeter) -> list[tuple[np.ndarray, np.ndarray]]:
        names = [where for where, _ in batch]
        encoded = encode_conversations(self.tokenizer, renderer, [messages for _, messages in batch], names)
        tokens = sum(int(ids.size) for ids, _ in encoded)
        count("documents", len(encoded))
        count("tokens", tokens)
        count("loss_tokens", sum(int(mask.sum()) for _, mask in encoded))
        meter.add(len(encoded), tokens)
        return encoded


def run_chat_tokenize(
    config: ChatTokenizeConfig,
    inputs: TokenizeInputs,
    output_path: str,
    *,
    template: str | None = None,
    backend: Any = None,
) -> TokenizedDataset:
    """Tokenize the conversations of every split of ``inputs`` into ``<output_path>/<split>``; resumable.

    ``template`` is what the step was declared with (None, a name or a Jinja text); it must resolve
    to the template ``config`` records. ``backend``: as for :func:`marin.processing.tokenize.run_tokenize`.
    """
    tokenizer = load_tokenizer(inputs.tokenizer, revision=inputs.tokenizer_revision)
    if config.tokenizer is not None and tokenizer.identity != config.tokenizer:
        raise TokenizerChangedError(
            f"tokenizer {inputs.tokenizer!r} now has identity {tokenizer.identity}, but this step was defined with "
            f"{config.tokenizer}; define the step again (rerun the script) so its hash matches the tokenizer."
        )
    chat_template = resolve_chat_template(tokenizer, template)
    recorded = config.template.get("digest")
    if recorded is not None and chat_template.digest != recorded:
        raise TokenizerChangedError(
            f"the chat template of tokenizer {inputs.tokenizer!r} is now {chat_template.digest}, but this step was "
            f"defined with {recorded}; define the step again (rerun the script) so its hash matches the template."
        )
    logger.info(
        "chat tokenize: tokenizer %s (%s, vocab %d), %s, source %s",
        inputs.tokenizer, tokenizer.identity[:19], tokenizer.vocab_size, describe_template(tokenizer, chat_template),
        describe_source(config.source),
    )
    splits: dict[str, TokenizedSplit] = {}
    for split in config.splits:
        files = list(inputs.split_files.get(split) or ())
        if not files:
            raise MissingSplitError(
                f"split {split!r} has no input files (inputs have: {', '.join(inputs.split_files) or 'none'})"
            )
        cache_url = fsx.join(output_path, split)
        splits[split] = _tokenize_split(config, tokenizer, chat_template, split, files, cache_url, backend)
    return TokenizedDataset(
        splits=splits,
        tokenizer_identity=tokenizer.identity,
        tokenizer_source=inputs.tokenizer,
        vocab_size=tokenizer.vocab_size,
        eos_id=None,  # nothing is appended: the template writes each turn's end marker itself
        bos_id=None,
        source=dict(config.source),
        builtin_source=inputs.builtin_source,
        builtin_tokenizer=inputs.builtin_tokenizer,
    )


def describe_template(tokenizer: HfTokenizer, template: ChatTemplate) -> str:
    """One phrase for the log: which template renders the conversations, and why that one."""
    if template.name == "tokenizer":
        how = "the tokenizer's own chat template"
    elif tokenizer.chat_template is None:
        how = f"the default {template.name!r} chat template (the tokenizer has none)"
    else:
        how = f"the {template.name!r} chat template"
    return f"{how} ({template.digest[:19]}, assistant replies marked by " + (
        "its {% generation %} blocks)" if template.marks_generation else "prefix renders)"
    )


def _tokenize_split(
    config: ChatTokenizeConfig,
    tokenizer: HfTokenizer,
    template: ChatTemplate,
    split: str,
    files: list[str],
    cache_url: str,
    backend: Any,
) -> TokenizedSplit:
    dataset, shards = encoding_pipeline(files, config.num_shards, config.sample_count, FieldReader(config.messages_field),
                                        EncodeConversationShard(tokenizer, template))
    metadata = {
        "split": split,
        "tokenizer": tokenizer.identity,
        "source": dict(config.source),
        "chat_template": template.identity(),
        "messages_field": config.messages_field,
        "sample_count": config.sample_count,
        "mask_rule": config.mask_rule,
        "bos_id": None,
        "eos_id": None,
    }
    started = time.perf_counter()
    result = write_token_cache(
        dataset,
        cache_url,
        vocab_size=tokenizer.vocab_size,
        metadata=metadata,
        loss_mask=True,
        skip_existing=True,
        backend=backend if backend is not None else shard_files_backend(shards),
    )
    elapsed = max(time.perf_counter() - started, 1e-9)
    cache = TokenCache.open(cache_url)
    trained = _trained_tokens(cache)
    logger.info(
        "chat tokenize %s: %d conversations, %d tokens, %d of them (%.1f%%) the assistant's and trained on, in %d "
        "shards -> %s; this run tokenized %d conversations in %.1fs%s",
        split, cache.num_documents, cache.num_tokens, trained, 100.0 * trained / max(cache.num_tokens, 1), len(shards),
        cache_url, result.counters.get("documents", 0), elapsed,
        f"; {len(result.skipped_shards)} finished shards reused" if result.skipped_shards else "",
    )
    return TokenizedSplit(cache_path=cache_url, documents=cache.num_documents, content_tokens=cache.num_tokens,
                          tokens=cache.num_tokens)


def _trained_tokens(cache: TokenCache) -> int:
    total = 0
    for start in range(0, cache.num_tokens, _COUNT_CHUNK_TOKENS):
        total += int(cache.read_loss_mask(start, min(start + _COUNT_CHUNK_TOKENS, cache.num_tokens)).sum(dtype=np.int64))
    return total
