"""The tokenize step: documents from a source, tokenized, into one token cache per split.

Output layout (``<out>`` is the step's output path)::

    <out>/train/        a token cache (see zephyr.token_cache): shards, then ledger.json last
    <out>/validation/   the same, when the source has a validation split

What goes into the step's hash is :class:`TokenizeConfig`: the *identities* of the source and the
tokenizer (content digests, hub revisions), never where they live. Where to read them from is
:class:`TokenizeInputs`, resolved when the step runs.

Sharding: each split's files are grouped, in order, into ``num_shards`` contiguous shards (default:
one per file, at most ``MAX_DEFAULT_SHARDS``); one token-cache shard per group, so the token stream
is the documents in source order. The plan depends only on the file list and the config, never on
the machine, so a rerun after a crash finds the same shards and redoes only those without a
``shard.json``. With ``sample_count`` the split is one shard that stops after that many documents.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from levanter.tokenization import (
    HfTokenizer,
    SpecialTokenPolicy,
    encode_documents,
    load_tokenizer,
)
from rigging import filesystem as fsx
from zephyr.dataset import Dataset
from zephyr.readers import DocumentReader
from zephyr.token_cache import TokenCache, dtype_for_vocab
from zephyr.worker_context import count
from zephyr.writers import write_token_cache

from marin.errors import MarinError
from marin.execution.running.shard_backend import default_backend

logger = logging.getLogger(__name__)

MAX_DEFAULT_SHARDS = 256
# Documents are handed to the tokenizer in batches of about this many characters: large enough for
# encode_batch to keep every core busy, small enough to bound memory per worker.
ENCODE_BATCH_CHARS = 2_000_000
_PROGRESS_EVERY_SECONDS = 10.0


class TokenizerChangedError(MarinError, RuntimeError):
    """The tokenizer found at run time is not the one whose identity the step was defined (hashed) with."""


class MissingSplitError(MarinError, ValueError):
    """A split the step was asked to tokenize has no input files."""


@dataclass(frozen=True)
class TokenizeConfig:
    """Everything that determines the tokens a tokenize step writes (its hash attributes).

    ``source``: the source's identity (hub id + revision, file digests, generator + seed).
    ``tokenizer``: the tokenizer's content identity (``sha256:...``), or None when the tokenizer is
    built by a dependency step (whose identity is then part of the hash through ``deps``).
    ``sample_count``: keep only the first N documents of each split (None: all).
    """

    source: Mapping[str, Any]
    tokenizer: str | None
    splits: tuple[str, ...] = ("train",)
    sample_count: int | None = None
    text_field: str = "text"
    prepend_bos: bool = False
    append_eos: bool = True
    num_shards: int | None = None

    def __post_init__(self) -> None:
        check_split_settings(self, "documents")


def check_split_settings(config: Any, unit: str) -> None:
    """The checks every tokenize config shares: some split, and positive ``sample_count`` (counted in ``unit``) and ``num_shards``."""
    if not config.splits:
        raise ValueError(f"{type(config).__name__} needs at least one split")
    if config.sample_count is not None and config.sample_count < 1:
        raise ValueError(f"sample_count must be a positive number of {unit} or None, got {config.sample_count}")
    if config.num_shards is not None and config.num_shards < 1:
        raise ValueError(f"num_shards must be >= 1 or None, got {config.num_shards}")


@dataclass(frozen=True)
class TokenizeInputs:
    """Where the step reads from (placement only; never hashed)."""

    split_files: Mapping[str, Sequence[str]]
    tokenizer: str  # a tokenizer.json path, a folder, a URL or a hub id
    tokenizer_revision: str | None = None  # for a hub id: the commit resolved when the step was defined
    # Whether the source / the tokenizer is the project's own offline stand-in, as the steps that
    # built them recorded it; passed on to the result for every reader downstream.
    builtin_source: bool = False
    builtin_tokenizer: bool = False


@dataclass(frozen=True)
class TokenizedSplit:
    cache_path: str
    documents: int
    content_tokens: int  # tokens the tokenizer produced, without BOS/EOS
    tokens: int  # tokens in the cache, with BOS/EOS as configured


@dataclass(frozen=True)
class TokenizedDataset:
    """The tokenize step's result (its ``.artifact.json``)."""

    splits: dict[str, TokenizedSplit]
    tokenizer_identity: str
    tokenizer_source: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    source: dict[str, Any] = field(default_factory=dict)
    builtin_source: bool = False  # the text is the project's built-in offline corpus
    builtin_tokenizer: bool = False  # the tokenizer is the project's built-in offline tokenizer

    def cache_path(self, split: str) -> str:
        try:
            return self.splits[split].cache_path
        except KeyError:
            raise KeyError(f"no split {split!r} in this tokenized dataset (splits: {', '.join(self.splits)})") from None


@dataclass(frozen=True)
class EncodeShard:
    """``map_shard`` function: texts in, token arrays of the cache's dtype out, encoded a batch at a time.

    Each batch is encoded in a background thread while the main thread writes the batch before it and
    reads the one after: encode_batch releases the GIL, so reading and writing (Python) overlap
    with encoding (Rust, on every core) instead of leaving the cores idle in between. Documents come
    out in input order; at most two batches wait for encoding.
    """

    tokenizer: HfTokenizer
    special: SpecialTokenPolicy
    batch_chars: int = ENCODE_BATCH_CHARS

    def __call__(self, texts: Iterator[str]) -> Iterator[np.ndarray]:
        meter = RateMeter()
        # Ids in the dtype the cache stores, so the writer keeps each array as it is.
        dtype = dtype_for_vocab(self.tokenizer.vocab_size)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize-encode")
        try:
            previous = None
            for batch in batches_by_chars(texts, self.batch_chars):
                encoding = pool.submit(encode_documents, self.tokenizer, batch, self.special, dtype=dtype)
                if previous is not None:
                    yield from _counted(previous.result(), meter)
                previous = encoding
            if previous is not None:
                yield from _counted(previous.result(), meter)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def batches_by_chars(texts: Iterator[str], batch_chars: int) -> Iterator[list[str]]:
    """``texts`` in consecutive lists of at least ``batch_chars`` characters (the last may be shorter):
    the batches the step hands to the tokenizer."""
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _counted(encoded: list[np.ndarray], meter: "RateMeter") -> list[np.ndarray]:
    # Counted here, in the shard's own thread: zephyr's counters belong to the running task's context.
    tokens = sum(int(ids.size) for ids in encoded)
    count("documents", len(encoded))
    count("tokens", tokens)
    meter.add(len(encoded), tokens)
    return encoded


class RateMeter:
    """A periodic progress line from inside a shard (rates only: a shard's size is not known upfront)."""

    def __init__(self) -> None:
        self.started = self.last_log = time.perf_counter()
        self.documents = self.tokens = 0

    def add(self, documents: int, tokens: int) -> None:
        self.documents += documents
        self.tokens += tokens
        now = time.perf_counter()
        if now - self.last_log >= _PROGRESS_EVERY_SECONDS:
            self.last_log = now
            elapsed = now - self.started
            logger.info(
                "tokenizing: %d documents, %d tokens so far (%.0f docs/s, %.0f tokens/s)",
                self.documents, self.tokens, self.documents / elapsed, self.tokens / elapsed,
            )


def plan_shards(files: Sequence[str], num_shards: int | None, sample_count: int | None) -> list[tuple[str, ...]]:
    """Contiguous groups of ``files``, one per cache shard; deterministic for a file list and config."""
    if not files:
        return []
    if sample_count is not None:
        return [tuple(files)]
    shards = min(len(files), num_shards or MAX_DEFAULT_SHARDS)
    per = math.ceil(len(files) / shards)
    return [tuple(files[i : i + per]) for i in range(0, len(files), per)]


@dataclass(frozen=True)
class FileGroup:
    """A source shard: the file paths of one cache shard (read by ``DocumentReader`` in the worker)."""

    files: tuple[str, ...]

    def __call__(self) -> Iterator[str]:
        return iter(self.files)


def run_tokenize(
    config: TokenizeConfig,
    inputs: TokenizeInputs,
    output_path: str,
    *,
    backend: Any = None,
) -> TokenizedDataset:
    """Tokenize every split of ``inputs`` into ``<output_path>/<split>``; resumable after a crash.

    ``backend``: where shards run: ``"inline"``, ``"threads"``, ``"processes"``, ``"ray"`` or a fray
    client (see :func:`fray.cluster.client_for`). By default the local process pool, one shard per
    worker, when a split has several shards and at least ``marin.execution.running.shard_backend.PROCESS_POOL_MIN_BYTES`` of input; else
    in-process, where encode_batch still uses every core and no worker start-up is paid.
    """
    tokenizer = load_tokenizer(inputs.tokenizer, revision=inputs.tokenizer_revision)
    if config.tokenizer is not None and tokenizer.identity != config.tokenizer:
        raise TokenizerChangedError(
            f"tokenizer {inputs.tokenizer!r} now has identity {tokenizer.identity}, but this step was defined with "
            f"{config.tokenizer}; define the step again (rerun the script) so its hash matches the tokenizer."
        )
    special = SpecialTokenPolicy.for_tokenizer(tokenizer, prepend_bos=config.prepend_bos, append_eos=config.append_eos)
    logger.info(
        "tokenize: tokenizer %s (%s, vocab %d), source %s",
        inputs.tokenizer, tokenizer.identity[:19], tokenizer.vocab_size, describe_source(config.source),
    )
    splits: dict[str, TokenizedSplit] = {}
    for split in config.splits:
        files = list(inputs.split_files.get(split) or ())
        if not files:
            raise MissingSplitError(
                f"split {split!r} has no input files (inputs have: {', '.join(inputs.split_files) or 'none'})"
            )
        splits[split] = _tokenize_split(config, tokenizer, special, split, files, fsx.join(output_path, split), backend)
    return TokenizedDataset(
        splits=splits,
        tokenizer_identity=tokenizer.identity,
        tokenizer_source=inputs.tokenizer,
        vocab_size=tokenizer.vocab_size,
        eos_id=special.eos_id,
        bos_id=special.bos_id,
        source=dict(config.source),
        builtin_source=inputs.builtin_source,
        builtin_tokenizer=inputs.builtin_tokenizer,
    )


def _tokenize_split(
    config: TokenizeConfig,
    tokenizer: HfTokenizer,
    special: SpecialTokenPolicy,
    split: str,
    files: list[str],
    cache_url: str,
    backend: Any,
) -> TokenizedSplit:
    dataset, shards = encoding_pipeline(files, config.num_shards, config.sample_count, DocumentReader(config.text_field),
                                        EncodeShard(tokenizer, special))
    metadata = {
        "split": split,
        "tokenizer": tokenizer.identity,
        "source": dict(config.source),
        "text_field": config.text_field,
        "sample_count": config.sample_count,
        "prepend_bos": config.prepend_bos,
        "append_eos": config.append_eos,
        "bos_id": special.bos_id,
        "eos_id": special.eos_id,
    }
    chosen_backend = backend if backend is not None else shard_files_backend(shards)
    started = time.perf_counter()
    result = write_token_cache(
        dataset, cache_url, vocab_size=tokenizer.vocab_size, metadata=metadata, skip_existing=True, backend=chosen_backend
    )
    elapsed = max(time.perf_counter() - started, 1e-9)
    cache = TokenCache.open(cache_url)
    documents, tokens = cache.num_documents, cache.num_tokens
    content = tokens - documents * special.extra_tokens_per_document
    fresh_docs = result.counters.get("documents", 0)
    fresh_tokens = result.counters.get("tokens", 0)
    logger.info(
        "tokenize %s: %d documents, %d tokens (%d content) in %d shards -> %s; this run tokenized %d documents, "
        "%d tokens in %.1fs (%.0f docs/s, %.0f tokens/s)%s",
        split, documents, tokens, content, len(shards), cache_url, fresh_docs, fresh_tokens, elapsed,
        fresh_docs / elapsed, fresh_tokens / elapsed,
        f"; {len(result.skipped_shards)} finished shards reused" if result.skipped_shards else "",
    )
    return TokenizedSplit(cache_path=cache_url, documents=documents, content_tokens=content, tokens=tokens)


def encoding_pipeline(files: list[str], num_shards: int | None, sample_count: int | None, reader: Any,
                      encoder: Any) -> tuple[Dataset, list[tuple[str, ...]]]:
    """What every tokenize step writes: ``files`` in shards, each read with ``reader`` (a file to its
    records), cut to ``sample_count`` records per shard, and encoded by ``encoder`` (records to token
    ids, or ids and masks); with the shards, which choose the default backend."""
    shards = plan_shards(files, num_shards, sample_count)
    dataset = Dataset.from_shards([FileGroup(group) for group in shards]).flat_map(reader)
    if sample_count is not None:
        dataset = dataset.take_per_shard(sample_count)
    return dataset.map_shard(encoder), shards


def shard_files_backend(shards: list[tuple[str, ...]]) -> str:
    """The default backend for these shards (see :mod:`marin.execution.running.shard_backend`)."""
    return default_backend(len(shards), (url for group in shards for url in group), "tokenize shards")


def describe_source(source: Mapping[str, Any]) -> str:
    description = source.get("description")
    if isinstance(description, str):
        return description
    kind = source.get("kind", "source")
    if source.get("stands_in_for"):
        return f"{kind} (stands in for {source['stands_in_for']})"
    if source.get("repo_id"):
        return f"{kind} {source['repo_id']}@{str(source.get('revision', ''))[:12]}"
    return str(kind)
