"""Token caches as decontamination references: documents decoded back to text with their tokenizer.

A reference cache is given as a tokenize step's handle (every split it wrote, decoded with the
tokenizer its result names), a token-cache folder or a folder of them (a tokenize step's output),
or a ``(folder, tokenizer)`` pair. A folder's tokenizer is found as ``marin serve`` finds it (the
ledger, else the record of the step that wrote the cache); a given or found tokenizer must have the
identity the cache's ledger records, so ids are never decoded with another vocabulary. Identity: a
handle's is its step's (it becomes a dependency); a folder's is its name and the digest of each
cache's ledger, which holds the checksum of every shard and the tokenizer's identity.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from levanter.tokenization import load_tokenizer
from rigging import filesystem as fsx
from zephyr.token_cache import TokenCache, is_token_cache_complete

from marin.curation.references import References
from marin.curation.steps import CurationError
from marin.execution.lazy import LazyStep
from marin.processing.tokenize import TokenizedDataset

_DECODE_BATCH = 256  # documents per decode_batch call


def cache_references(caches: Sequence[Any]) -> list[References]:
    """One :class:`References` per entry of ``caches`` (folders are found and identified now)."""
    if isinstance(caches, (str, os.PathLike, LazyStep)):
        raise CurationError(f"eval_caches must be a list of token caches, got {caches!r}; wrap it in a list")
    references = []
    for entry in caches:
        cache, tokenizer = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
        if isinstance(cache, LazyStep) and tokenizer is None:
            references.append(_step_references(cache))
        elif isinstance(cache, (str, os.PathLike)):
            references.append(_folder_references(os.fspath(cache), None if tokenizer is None else os.fspath(tokenizer)))
        else:
            raise CurationError(f"an eval cache must be a tokenize step's handle, a token-cache folder or a "
                                f"(folder, tokenizer) pair; got {entry!r}")
    return references


def _step_references(handle: LazyStep) -> References:
    def items(ctx) -> Iterator[tuple[str, str]]:
        result = ctx.load_artifact(handle, TokenizedDataset).result
        tokenizer = load_tokenizer(result.tokenizer_source)
        for split, data in result.splits.items():
            yield from cache_items(f"{handle.name}/{split}", data.cache_path, tokenizer)

    return References(label=f"token caches of {handle.name}", identity={"kind": "tokenize step"},
                      items_at_run_time=items, deps=(handle,))


def _folder_references(folder: str, tokenizer: str | None) -> References:
    folder = fsx.absolute(folder).rstrip("/")
    base = folder.rsplit("/", 1)[-1]
    if is_token_cache_complete(folder):
        caches = {base: folder}
    else:
        children = sorted(str(path).rstrip("/").rsplit("/", 1)[-1] for path in fsx.ls(folder)) if fsx.exists(folder) else []
        caches = {f"{base}/{child}": fsx.join(folder, child) for child in children
                  if is_token_cache_complete(fsx.join(folder, child))}
    if not caches:
        raise CurationError(f"{folder} is neither a finished token cache nor a folder of them (a tokenize step's "
                            "output); give a cache folder or the tokenize step's handle")
    identity = {"kind": "token caches", "caches": {name: ledger_digest(url) for name, url in caches.items()}}

    def items(ctx) -> Iterator[tuple[str, str]]:
        loaded = None if tokenizer is None else load_tokenizer(tokenizer)
        for name, url in caches.items():
            yield from cache_items(name, url, loaded or _recorded_tokenizer(url))

    return References(label=f"token caches in {folder}", identity=identity, items_at_run_time=items)


def ledger_digest(url: str) -> str:
    """The digest of a cache's ledger: it records every shard's checksums and the tokenizer's identity."""
    ledger = TokenCache.open(url, verify_checksums=False).ledger
    return "sha256:" + hashlib.sha256(json.dumps(ledger, sort_keys=True).encode("utf-8")).hexdigest()


def _recorded_tokenizer(url: str) -> Any:
    from marin.serve.data import cache_tokenizer

    tokenizer, note = cache_tokenizer(url, TokenCache.open(url, verify_checksums=False).metadata)
    if tokenizer is None:
        why = note.removeprefix("token ids shown undecoded (").removesuffix(")")
        raise CurationError(f"token cache {url}: its tokenizer was not found ({why}); give the cache as a "
                            "(folder, tokenizer) pair with the tokenizer that made it")
    return tokenizer


def cache_items(name: str, url: str, tokenizer: Any) -> Iterator[tuple[str, str]]:
    """``(<name>:<document index>, text)`` per document of the cache at ``url`` (indices from 0, as
    ``TokenCache.document`` and ``marin serve`` number them); special tokens (BOS, EOS) are left out."""
    cache = TokenCache.open(url)
    recorded = cache.metadata.get("tokenizer")
    if recorded and recorded != tokenizer.identity:
        raise CurationError(f"token cache {url} was written by tokenizer {str(recorded)[:19]}..., but "
                            f"{tokenizer.source} is {tokenizer.identity[:19]}...; decode it with the tokenizer that wrote it")
    for first in range(0, cache.num_documents, _DECODE_BATCH):
        indices = range(first, min(first + _DECODE_BATCH, cache.num_documents))
        texts = tokenizer.tokenizer.decode_batch([cache.document(i).tolist() for i in indices], skip_special_tokens=True)
        for index, text in zip(indices, texts, strict=True):
            yield f"{name}:{index}", text
