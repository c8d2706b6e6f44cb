"""The ledger: ``ledger.json``, the record that makes a cache finished, written and read with checks.

A ledger is data: shard paths in it must be plain relative folders inside the cache (no absolute
paths, ``..`` or URLs), so a ledger can never direct reads elsewhere. Caches of format
``marin-token-cache/1`` carry no checksums and are refused with a request to re-tokenize rather
than trusted unverified.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from zephyr._fs import atomic_write_text, join_url, url_to_fs
from zephyr.token_cache.errors import (
    CorruptTokenCacheError,
    IncompleteTokenCacheError,
    OutdatedTokenCacheError,
    TokenCacheError,
    remedy,
)
from zephyr.token_cache.layout import (
    CHECKSUM_ALGORITHM,
    FORMAT,
    FORMAT_WITH_LOSS_MASK,
    LEDGER_NAME,
    LOSS_MASK_NAME,
    OFFSETS_NAME,
    SHARD_SUMMARY_NAME,
    TOKENS_NAME,
    dtype_for_vocab,
    dtype_name,
    read_shard_summary,
)

# Formats this reader knows but refuses, with the reason given to the user.
_REFUSED_FORMATS = {
    "marin-token-cache/1": "it was written before token caches recorded checksums, so its files cannot be verified",
}


def finalize_token_cache(
    cache_url: str,
    shard_paths: Sequence[str],
    *,
    vocab_size: int,
    metadata: dict[str, Any] | None = None,
    loss_mask: bool | None = None,
) -> dict[str, Any]:
    """Check every listed shard is finished and write ``ledger.json`` (last, atomically).

    ``shard_paths`` are shard folders relative to ``cache_url`` (``"shard-00000"``) or full URLs
    under it; their order is the cache's document order. A shard holding an id at or above
    ``vocab_size`` is refused: the ledger would claim a vocabulary its own tokens do not fit.
    ``loss_mask``: whether every shard must carry a loss mask (True) or none may (False); None
    takes the shards' word, which must be the same for all of them.
    """
    cache_url = str(cache_url).rstrip("/")
    expected = dtype_name(dtype_for_vocab(vocab_size))
    shards = []
    masked: dict[bool, list[str]] = {}
    for shard_path in shard_paths:
        relative = _relative_shard_path(cache_url, str(shard_path))
        summary = read_shard_summary(join_url(cache_url, relative))
        if summary is None:
            raise IncompleteTokenCacheError(
                f"shard {relative!r} of token cache {cache_url} has no {SHARD_SUMMARY_NAME}: it was never "
                "finished; rerun the step that writes it"
            )
        if summary.dtype != expected:
            raise ValueError(
                f"shard {relative!r} stores {summary.dtype} but vocab_size={vocab_size} needs {expected}"
            )
        if summary.max_token_id is not None and summary.max_token_id >= vocab_size:
            raise ValueError(
                f"shard {relative!r} of token cache {cache_url} holds token id {summary.max_token_id}, outside "
                f"vocab_size={vocab_size}; the tokenizer's vocab_size does not cover the ids it produced"
            )
        masked.setdefault(summary.has_loss_mask, []).append(relative)
        shards.append({"path": relative, **summary.record()})
        del shards[-1]["dtype"]  # one dtype for the whole cache, recorded once below
    if len(masked) > 1:
        raise ValueError(
            f"token cache {cache_url} mixes shards with loss masks ({', '.join(masked[True])}) and without "
            f"({', '.join(masked[False])}); a cache has a mask in every shard or in none"
        )
    has_mask = next(iter(masked), bool(loss_mask))
    if loss_mask is not None and has_mask != loss_mask:
        raise ValueError(
            f"the shards of token cache {cache_url} {'carry' if has_mask else 'lack'} loss masks, but the cache "
            f"was to be written {'with' if loss_mask else 'without'} them; rewrite its shards"
        )
    largest = [s["max_token_id"] for s in shards if s["max_token_id"] is not None]
    ledger = {
        "format": FORMAT_WITH_LOSS_MASK if has_mask else FORMAT,
        "dtype": expected,
        "vocab_size": int(vocab_size),
        "documents": sum(s["documents"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "max_token_id": max(largest) if largest else None,
        "shards": shards,
        "metadata": dict(metadata or {}),
    }
    atomic_write_text(join_url(cache_url, LEDGER_NAME), json.dumps(ledger, indent=2, sort_keys=True))
    return ledger


def _relative_shard_path(cache_url: str, shard_path: str) -> str:
    if shard_path.startswith(cache_url + "/"):
        relative = shard_path[len(cache_url) + 1 :].strip("/")
    else:
        relative = shard_path.rstrip("/")
    if not _is_inside_cache(relative):
        raise ValueError(f"shard {shard_path!r} is not a folder inside token cache {cache_url}")
    return relative


def _is_inside_cache(relative: str) -> bool:
    """True for a plain relative folder path: no absolute path, URL, ``..``, ``.`` or empty segment."""
    if not isinstance(relative, str) or not relative or "\\" in relative or ":" in relative:
        return False
    return all(part not in ("", ".", "..") for part in relative.split("/"))


def is_token_cache_complete(url: str) -> bool:
    fs, path = url_to_fs(join_url(url, LEDGER_NAME))
    return fs.exists(path)


def read_ledger(url: str) -> dict[str, Any]:
    """The ledger of the cache at ``url``, checked for shape; every problem is a :class:`TokenCacheError`."""
    ledger_url = join_url(url, LEDGER_NAME)
    fs, path = url_to_fs(ledger_url)
    try:
        with fs.open(path, "rb") as handle:
            ledger = json.loads(handle.read())
    except FileNotFoundError:
        if not fs.exists(url_to_fs(url)[1]):
            raise FileNotFoundError(f"no token cache at {url}") from None
        raise IncompleteTokenCacheError(
            f"token cache {url} has no {LEDGER_NAME}: it was never finished (a tokenize run crashed "
            "or is still running); rerun the step that writes it"
        ) from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise CorruptTokenCacheError(f"{ledger_url} is not valid JSON ({error}); {remedy(url)}") from None
    if not isinstance(ledger, dict):
        raise CorruptTokenCacheError(f"{ledger_url} is not a JSON object; {remedy(url)}")
    format_name = ledger.get("format")
    if format_name in _REFUSED_FORMATS:
        raise OutdatedTokenCacheError(
            f"token cache {url} has format {format_name}: {_REFUSED_FORMATS[format_name]}. Re-tokenize: "
            f"{remedy(url)}"
        )
    if format_name not in (FORMAT, FORMAT_WITH_LOSS_MASK):
        raise TokenCacheError(
            f"{ledger_url}: unsupported token cache format {format_name!r}, expected {FORMAT} or "
            f"{FORMAT_WITH_LOSS_MASK}; a newer version of this library may have written it, or " + remedy(url)
        )
    problem = _ledger_problem(ledger)
    if problem:
        raise CorruptTokenCacheError(f"{ledger_url} is damaged: {problem}; {remedy(url)}")
    return ledger


def _ledger_problem(ledger: dict[str, Any]) -> str | None:
    """What is wrong with a ledger's shape, or None; checked before any field is used."""

    def count(record: Mapping[str, Any], key: str) -> bool:
        value = record.get(key)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    masked = ledger.get("format") == FORMAT_WITH_LOSS_MASK
    if ledger.get("dtype") not in ("uint16", "uint32"):
        return f"'dtype' is {ledger.get('dtype')!r}, not 'uint16' or 'uint32'"
    for key in ("vocab_size", "documents", "tokens"):
        if not count(ledger, key):
            return f"{key!r} is {ledger.get(key)!r}, not a count"
    if ledger["vocab_size"] == 0:
        return "'vocab_size' is 0"
    if not isinstance(ledger.get("metadata"), dict):
        return "'metadata' is not an object"
    if not isinstance(ledger.get("shards"), list):
        return "'shards' is not a list"
    for index, shard in enumerate(ledger["shards"]):
        if not isinstance(shard, dict):
            return f"shard {index} is not an object"
        if not _is_inside_cache(shard.get("path")):
            return (
                f"shard {index} has path {shard.get('path')!r}, which is not a folder inside the cache (a ledger "
                "may only name relative folders inside its own cache: no absolute paths, '..' or URLs)"
            )
        for key in ("documents", "tokens"):
            if not count(shard, key):
                return f"shard {shard['path']!r} has {key!r} {shard.get(key)!r}, not a count"
        if shard.get("max_token_id") is not None and not count(shard, "max_token_id"):
            return f"shard {shard['path']!r} has 'max_token_id' {shard.get('max_token_id')!r}"
        checksums = shard.get("checksums")
        for name in (TOKENS_NAME, OFFSETS_NAME) + ((LOSS_MASK_NAME,) if masked else ()):
            value = checksums.get(name) if isinstance(checksums, dict) else None
            if not (isinstance(value, str) and value.startswith(CHECKSUM_ALGORITHM + ":")):
                return f"shard {shard['path']!r} has no {CHECKSUM_ALGORITHM} checksum for {name}"
        if not masked and LOSS_MASK_NAME in checksums:
            return f"shard {shard['path']!r} lists a loss mask, which format {FORMAT} does not have"
    return None
