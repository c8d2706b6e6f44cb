"""Keyed entries spilled to scratch in sorted runs, and read back merged: an external sort.

An entry is a fixed-width record: a 128-bit key (``key``, ``key2``) and the document it names
(``shard``, ``ordinal``: the document's place among the considered documents of its input shard).
A shard's worker fills a buffer of at most ``SpillSettings.buffer_entries`` entries, sorts it by
key and writes it as one run file; a run is laid out by partition (partitions are ranges of
``key``, so key order is partition order) with the offsets of each partition in a small index
beside it. A partition's worker merges the runs of every shard block by block: from each run it
takes only entries up to the smallest key any run has buffered, so the merged stream comes out in
key order while each run holds at most ``read_chunk`` entries in memory. Neither worker's memory
depends on how many documents a shard has; only the number of runs to merge grows, and a shard
merges its own runs down to ``fan_in`` before it finishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from rigging.filesystem import atomic_open, filesystem, join, open_url

ENTRY = np.dtype([("key", "<u8"), ("key2", "<u8"), ("shard", "<u4"), ("ordinal", "<u4")])
_RUN_SUFFIX = ".run"
_INDEX_SUFFIX = ".idx"


@dataclass(frozen=True)
class SpillSettings:
    """What bounds a dedup worker's memory; none of it changes what the steps decide or write.

    ``batch_docs``: documents read (and signed) at once. ``buffer_entries``: keyed entries a shard
    holds before writing a sorted run. ``read_chunk``: entries read at once from each run while
    merging. ``fan_in``: runs a shard leaves for the merge (more are merged first). ``lookup_batch``:
    members of candidate groups whose ids (and signatures) are read from the document tables at once.
    ``record_buffer``: decisions (for the join) or component messages held before a sorted run of
    them is written.
    """

    batch_docs: int = 512
    buffer_entries: int = 1 << 17
    read_chunk: int = 4096
    fan_in: int = 32
    lookup_batch: int = 1 << 12
    record_buffer: int = 1 << 14

    def __post_init__(self) -> None:
        for name in ("batch_docs", "buffer_entries", "read_chunk", "lookup_batch", "record_buffer"):
            if getattr(self, name) < 1:
                raise ValueError(f"SpillSettings.{name} must be at least 1, got {getattr(self, name)}")
        if self.fan_in < 2:
            raise ValueError(f"SpillSettings.fan_in must be at least 2, got {self.fan_in}")


def partition_bounds(partitions: int) -> np.ndarray:
    """The first key of each partition: ``partitions`` equal ranges of the 64-bit keys."""
    return np.array([(i << 64) // partitions for i in range(partitions)], dtype=np.uint64)


def sort_entries(entries: np.ndarray) -> np.ndarray:
    """By (``key``, ``key2``): what grouping needs. The order within a group is not promised."""
    return entries[np.lexsort((entries["key2"], entries["key"]))]


def _write_run(url: str, blocks: Iterable[np.ndarray], bounds: np.ndarray) -> int:
    """Write sorted ``blocks`` as one run with its partition index; returns the entries written."""
    offsets = np.zeros(len(bounds) + 1, dtype=np.int64)
    written = 0
    with atomic_open(url + _RUN_SUFFIX, "wb") as handle:
        for block in blocks:
            # Entries before partition p's first key, counted block by block.
            offsets[1:-1] += np.searchsorted(block["key"], bounds[1:], side="left")
            written += len(block)
            handle.write(block.tobytes())
    offsets[-1] = written
    with atomic_open(url + _INDEX_SUFFIX, "wb") as handle:
        handle.write(offsets.tobytes())
    return written


class RunWriter:
    """A shard's entries as sorted runs under ``folder`` (names start with ``shard-<shard>``)."""

    def __init__(self, folder: str, shard: int, partitions: int, settings: SpillSettings):
        self.folder, self.shard, self.settings = folder, shard, settings
        self.bounds = partition_bounds(partitions)
        self.buffer = np.empty(settings.buffer_entries, dtype=ENTRY)
        self.filled = 0
        self.runs: list[str] = []
        self.merges = 0

    def add(self, entries: np.ndarray) -> None:
        while len(entries):
            room = min(len(self.buffer) - self.filled, len(entries))
            self.buffer[self.filled:self.filled + room] = entries[:room]
            self.filled += room
            entries = entries[room:]
            if self.filled == len(self.buffer):
                self._spill()

    def _spill(self) -> None:
        if self.filled:
            url = join(self.folder, f"shard-{self.shard:05d}-run-{len(self.runs) + self.merges:05d}")
            _write_run(url, [sort_entries(self.buffer[:self.filled])], self.bounds)
            self.runs.append(url)
            self.filled = 0

    def close(self) -> list[str]:
        """Spill what is buffered; merge runs down to ``fan_in``; the runs' names (without suffix)."""
        self._spill()
        self.buffer = np.empty(0, dtype=ENTRY)
        while len(self.runs) > self.settings.fan_in:
            group, self.runs = self.runs[:self.settings.fan_in], self.runs[self.settings.fan_in:]
            self.merges += 1
            url = join(self.folder, f"shard-{self.shard:05d}-merged-{self.merges:05d}")
            streams = [read_run(run, 0, len(self.bounds), self.settings.read_chunk) for run in group]
            _write_run(url, merge_sorted(streams), self.bounds)
            for run in group:
                remove_run(run)
            self.runs.append(url)
        return list(self.runs)


def remove_run(url: str) -> None:
    for suffix in (_RUN_SUFFIX, _INDEX_SUFFIX):
        fs, path = filesystem(url + suffix)
        fs.rm(path)


def list_runs(folder: str) -> list[str]:
    fs, path = filesystem(folder)
    if not fs.exists(path):
        return []
    names = sorted(name.rsplit("/", 1)[-1] for name in fs.ls(path, detail=False) if name.endswith(_RUN_SUFFIX))
    return [join(folder, name[: -len(_RUN_SUFFIX)]) for name in names]


def read_run(url: str, first: int, last: int, chunk: int) -> Iterator[np.ndarray]:
    """Entries of partitions ``first`` to ``last - 1`` of one run, ``chunk`` at a time."""
    with open_url(url + _INDEX_SUFFIX, "rb") as handle:
        offsets = np.frombuffer(handle.read(), dtype=np.int64)
    start, end = int(offsets[first]), int(offsets[last])
    if start == end:
        return
    with open_url(url + _RUN_SUFFIX, "rb") as handle:
        handle.seek(start * ENTRY.itemsize)
        while start < end:
            count = min(chunk, end - start)
            data = handle.read(count * ENTRY.itemsize)
            if len(data) != count * ENTRY.itemsize:
                raise EOFError(f"{url}{_RUN_SUFFIX} ends before its index says (entry {start} of {end})")
            yield np.frombuffer(data, dtype=ENTRY)
            start += count


def merge_sorted(streams: Iterable[Iterator[np.ndarray]]) -> Iterator[np.ndarray]:
    """One sorted stream of blocks from sorted streams of blocks (a k-way merge, a block at a time).

    Each round takes, from every stream's current block, the entries whose key is at most the
    smallest last key of those blocks: nothing still unread can sort before them. Equal keys may
    straddle two output blocks; :func:`groups` joins them.
    """
    heads: list[tuple[np.ndarray, Iterator[np.ndarray]]] = []
    for stream in streams:
        block = next(stream, None)
        if block is not None:
            heads.append((block, stream))
    while heads:
        bound = min(block["key"][-1] for block, _ in heads)
        taken, kept = [], []
        for block, stream in heads:
            cut = int(np.searchsorted(block["key"], bound, side="right"))
            taken.append(block[:cut])
            if cut == len(block):
                block = next(stream, None)
                if block is None:
                    continue
            else:
                block = block[cut:]
            kept.append((block, stream))
        heads = kept
        taken = [block for block in taken if len(block)]
        yield taken[0] if len(taken) == 1 else sort_entries(np.concatenate(taken))


def groups(blocks: Iterable[np.ndarray], min_size: int) -> Iterator[np.ndarray]:
    """Runs of entries with equal (``key``, ``key2``) and at least ``min_size`` members, in key order.

    Only the entries of the key still open at a block's end are carried to the next block.
    """
    carry = np.empty(0, dtype=ENTRY)
    for block in blocks:
        if len(carry):
            block = sort_entries(np.concatenate([carry, block]))
        last = int(np.searchsorted(block["key"], block["key"][-1], side="left"))
        carry = block[last:]
        yield from _complete_groups(block[:last], min_size)
    yield from _complete_groups(carry, min_size)


def _complete_groups(block: np.ndarray, min_size: int) -> Iterator[np.ndarray]:
    if len(block) < min_size:
        return
    change = (block["key"][1:] != block["key"][:-1]) | (block["key2"][1:] != block["key2"][:-1])
    starts = np.concatenate(([0], np.flatnonzero(change) + 1))
    sizes = np.diff(np.concatenate((starts, [len(block)])))
    for start, size in zip(starts[sizes >= min_size], sizes[sizes >= min_size]):
        yield block[start:start + size]
