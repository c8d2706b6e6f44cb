"""The first difference between two files of data, named the way a person looks for it.

Each function compares an original file (or token-cache shard) with its rerun and returns ``None``
when they hold the same thing, or one sentence saying where they first differ: a byte offset for
files of unknown kind, a key path for JSON, a record number for JSON lines and Parquet, a record
(document) number and token position for token-cache shards. Files are streamed in bounded
chunks, local or remote, so a large output is never held in memory; records are parsed only
where their bytes differ.

``normalize`` turns a parsed record into what must match: it drops measurements (times, rates)
and writes the two runs' output locations alike (see :mod:`marin.execution.reproducibility.output_comparison`).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from rigging import filesystem as fsx

CHUNK_BYTES = 8 << 20
Normalize = Callable[[Any], Any]


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _chunks(url: str, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    with fsx.open_url(url, "rb") as handle:
        while True:
            data = handle.read(chunk)
            if not data:
                return
            yield data


def _first_item_difference(original: str, rerun: str, itemsize: int = 1) -> tuple[int, int, int] | None:
    """``(index, items in the original, items in the rerun)`` of the first differing ``itemsize``-byte
    item (``index`` may be the shorter length when one is a prefix of the other), or ``None``."""
    chunk = CHUNK_BYTES - CHUNK_BYTES % itemsize
    position = 0
    a_chunks, b_chunks = _chunks(original, chunk), _chunks(rerun, chunk)
    pending_a, pending_b = b"", b""
    while True:
        if not pending_a:
            pending_a = next(a_chunks, b"")
        if not pending_b:
            pending_b = next(b_chunks, b"")
        if not pending_a and not pending_b:
            return None
        size = min(len(pending_a), len(pending_b))
        a, b = pending_a[:size], pending_b[:size]
        if a != b or not size:
            if not size:  # one file ended
                index = position // itemsize
            else:
                diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))[0]
                index = (position + int(diff)) // itemsize
            return index, _size_of(original) // itemsize, _size_of(rerun) // itemsize
        position += size
        pending_a, pending_b = pending_a[size:], pending_b[size:]


def _size_of(url: str) -> int:
    fs, path = fsx.filesystem(url)
    return int(fs.size(path))


def same_bytes(original: str, rerun: str) -> bool:
    return _first_item_difference(original, rerun) is None


def byte_difference(original: str, rerun: str) -> str | None:
    found = _first_item_difference(original, rerun)
    if found is None:
        return None
    offset, size_a, size_b = found
    sizes = f" (sizes {size_a:,} and {size_b:,} bytes)" if size_a != size_b else ""
    return f"bytes differ from offset {offset:,}{sizes}"


def value_difference(original: Any, rerun: Any, where: str = "") -> str | None:
    """Where two parsed JSON values first differ (keys in sorted order), or ``None``."""
    label = where or "the value"
    if isinstance(original, dict) and isinstance(rerun, dict):
        for key in sorted(set(original) | set(rerun)):
            inner = f"{where}.{key}" if where else str(key)
            if key not in rerun:
                return f"{inner}: only in the original ({_short(original[key])})"
            if key not in original:
                return f"{inner}: only in the rerun ({_short(rerun[key])})"
            found = value_difference(original[key], rerun[key], inner)
            if found:
                return found
        return None
    if isinstance(original, list) and isinstance(rerun, list):
        for index, (a, b) in enumerate(zip(original, rerun)):
            found = value_difference(a, b, f"{where}[{index}]")
            if found:
                return found
        if len(original) != len(rerun):
            return f"{label}: {len(original)} items in the original, {len(rerun)} in the rerun"
        return None
    same = type(original) is type(rerun) and (
        original == rerun or (isinstance(original, float) and math.isnan(original) and math.isnan(rerun))
    )
    return None if same else f"{label}: {_short(original)} in the original, {_short(rerun)} in the rerun"


def json_difference(original: str, rerun: str, normalize: Normalize) -> str | None:
    """Compare two JSON files as values (a file that does not parse is compared by its bytes)."""
    try:
        a = json.loads(fsx.read_text(original) or "null")
        b = json.loads(fsx.read_text(rerun) or "null")
    except (ValueError, UnicodeDecodeError):
        return byte_difference(original, rerun)
    return value_difference(normalize(a), normalize(b))


def _lines(url: str) -> Iterator[str]:
    with fsx.open_url(url, "rt", compression="infer", encoding="utf-8", newline="\n") as handle:
        for line in handle:
            yield line.rstrip("\n")


def jsonl_difference(original: str, rerun: str, normalize: Normalize) -> str | None:
    """The first record (line, counted from 0) of two JSON-lines files (plain or compressed) that differs."""
    a_lines, b_lines = _lines(original), _lines(rerun)
    record = 0
    while True:
        a, b = next(a_lines, None), next(b_lines, None)
        if a is None and b is None:
            return None
        if a is None or b is None:
            longer, rest = ("original", a_lines) if b is None else ("rerun", b_lines)
            total = record + 1 + sum(1 for _ in rest)
            return f"record {record:,}: only in the {longer} (the {longer} has {total:,} records, the other {record:,})"
        if a != b:
            try:
                found = value_difference(normalize(json.loads(a)), normalize(json.loads(b)))
            except ValueError:
                found = f"line {record + 1} differs (not JSON)"
            if found:
                return f"record {record:,} differs: {found}"
        record += 1


def _rows(url: str) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    with fsx.open_url(url, "rb") as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=1024):
            yield from batch.to_pylist()


def parquet_difference(original: str, rerun: str, normalize: Normalize) -> str | None:
    """The first row (counted from 0) of two Parquet files that differs, compared as values."""
    a_rows, b_rows = _rows(original), _rows(rerun)
    row = 0
    while True:
        a, b = next(a_rows, None), next(b_rows, None)
        if a is None and b is None:
            return None
        if a is None or b is None:
            longer, rest = ("original", a_rows) if b is None else ("rerun", b_rows)
            total = row + 1 + sum(1 for _ in rest)
            return f"record {row:,}: only in the {longer} (the {longer} has {total:,} records, the other {row:,})"
        found = value_difference(normalize(_plain(a)), normalize(_plain(b)))
        if found:
            return f"record {row:,} differs: {found}"
        row += 1


def _plain(row: dict[str, Any]) -> Any:
    """A Parquet row as JSON-like values (bytes and dates as text), so it compares like a JSON record."""
    return json.loads(json.dumps(row, default=str))


# -- token-cache shards (zephyr.token_cache): tokens.bin, offsets.bin, loss_mask.bin, shard.json --


def _shard_dtype(shard_url: str) -> np.dtype | None:
    try:
        return np.dtype(json.loads(fsx.read_text(fsx.join(shard_url, "shard.json")) or "{}")["dtype"])
    except (ValueError, KeyError, TypeError):
        return None


def _offsets(shard_url: str) -> np.ndarray:
    with fsx.open_url(fsx.join(shard_url, "offsets.bin"), "rb") as handle:
        return np.frombuffer(handle.read(), dtype="<i8")


def _cache_record(shard_url: str, record: int) -> str:
    """`` (record N of the cache FOLDER)`` from the cache's ledger: the shards before this one count too."""
    cache_url, _, shard = shard_url.rstrip("/").rpartition("/")
    try:
        ledger = json.loads(fsx.read_text(fsx.join(cache_url, "ledger.json")) or "{}")
        before = 0
        for entry in ledger["shards"]:
            if entry["path"] == shard:
                return f" (record {before + record:,} of the cache {cache_url.rsplit('/', 1)[-1]}/)"
            before += int(entry["documents"])
    except (ValueError, KeyError, TypeError):
        pass
    return ""


def token_shard_difference(original: str, rerun: str, files: set[str]) -> str | None:
    """The first record (document) of two token-cache shard folders that differs, with where in it.

    ``files``: the names found in either folder. A record differs when its tokens, its loss mask or
    its boundary differ; counts and checksums in ``shard.json`` follow from those and are compared last.
    """
    dtype, rerun_dtype = _shard_dtype(original), _shard_dtype(rerun)
    if dtype is None or dtype != rerun_dtype:
        return f"token dtype (shard.json): {dtype} in the original, {rerun_dtype} in the rerun"
    offsets = _offsets(original)
    found: list[tuple[int, str]] = []
    for name, itemsize, unit in (("offsets.bin", 8, "boundary"), ("tokens.bin", dtype.itemsize, "token"), ("loss_mask.bin", 1, "loss-mask entry")):
        if name not in files:
            continue
        a, b = fsx.join(original, name), fsx.join(rerun, name)
        if not fsx.exists(a) or not fsx.exists(b):
            return f"{name} is only in the {'rerun' if fsx.exists(b) else 'original'}"
        difference = _first_item_difference(a, b, itemsize)
        if difference is None:
            continue
        index, count_a, count_b = difference
        if name == "offsets.bin":
            record = max(0, index - 1)
            found.append((record, f"its end differs ({name} entry {index:,})"))
            continue
        record = max(0, bisect.bisect_right(offsets, index) - 1)
        if index >= min(count_a, count_b):
            detail = f"the original has {count_a:,} {unit}s, the rerun {count_b:,}"
        else:
            item_dtype = dtype if name == "tokens.bin" else np.uint8
            a_value, b_value = _item(a, index, item_dtype), _item(b, index, item_dtype)
            where = index - int(offsets[record]) if record < len(offsets) else index
            detail = f"its {unit} {where:,} is {a_value} in the original, {b_value} in the rerun"
        found.append((record, detail))
    if found:
        record, detail = min(found)
        return f"record {record:,}{_cache_record(original, record)} differs: {detail}"
    if "shard.json" in files:
        return json_difference(fsx.join(original, "shard.json"), fsx.join(rerun, "shard.json"), lambda value: value)
    return None


def _item(url: str, index: int, dtype: np.dtype) -> int:
    dtype = np.dtype(dtype).newbyteorder("<")
    with fsx.open_url(url, "rb") as handle:
        handle.seek(index * dtype.itemsize)
        return int(np.frombuffer(handle.read(dtype.itemsize), dtype=dtype)[0])


__all__ = [
    "byte_difference",
    "json_difference",
    "jsonl_difference",
    "parquet_difference",
    "same_bytes",
    "token_shard_difference",
    "value_difference",
]
