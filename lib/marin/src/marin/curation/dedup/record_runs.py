"""Small keyed records spilled to sorted jsonl runs per partition, and read back merged by key.

A writer holds at most ``buffer`` records; when full it sorts them by (partition, key) and writes
one run per partition it holds (``<folder>/part-<p>/from-<source>-run-<n>.jsonl``). Reading a
partition merges its runs with ``heapq.merge``: one line of each run in memory. This is what
the join (decisions by position, per input file) and the connected components (messages by
node id) use, so neither holds a whole shard's records.
"""

from __future__ import annotations

import heapq
import itertools
import json
import zlib
from collections.abc import Iterator
from typing import Any

from rigging.filesystem import atomic_open, filesystem, join, open_url


def partition_of(key: str, partitions: int) -> int:
    """A string key's partition, the same in every process."""
    return zlib.crc32(key.encode("utf-8")) % partitions


class RecordRuns:
    """``add(partition, key, value)``; ``close()`` writes what is held. Source ``source`` names its runs."""

    def __init__(self, folder: str, source: int, buffer: int):
        self.folder, self.source, self.buffer = folder, source, buffer
        self.held: list[tuple[int, Any, Any]] = []
        self.runs = 0

    def add(self, partition: int, key: Any, value: Any) -> None:
        self.held.append((partition, key, value))
        if len(self.held) >= self.buffer:
            self._write()

    def _write(self) -> None:
        if not self.held:
            return
        self.held.sort(key=_partition_and_key)  # stable: one key's records keep their order
        for partition, records in itertools.groupby(self.held, key=_partition):
            url = join(self.folder, f"part-{partition:05d}", f"from-{self.source:05d}-run-{self.runs:05d}.jsonl")
            with atomic_open(url, "w") as handle:
                handle.writelines(json.dumps([key, value]) + "\n" for _, key, value in records)
        self.held, self.runs = [], self.runs + 1

    def close(self) -> int:
        self._write()
        return self.runs


def _partition_and_key(record: tuple) -> tuple:
    return record[0], record[1]


def _partition(record: tuple) -> int:
    return record[0]


def _key(item: list) -> Any:
    return item[0]


def _lines(url: str) -> Iterator[list]:
    with open_url(url, "rb") as handle:
        for line in handle:
            yield json.loads(line)


def merged(folder: str, partition: int) -> Iterator[list]:
    """``[key, value]`` of every run of ``partition``, in key order (runs in name order break ties)."""
    fs, path = filesystem(join(folder, f"part-{partition:05d}"))
    if not fs.exists(path):
        return iter(())
    names = sorted(name.rsplit("/", 1)[-1] for name in fs.ls(path, detail=False) if name.endswith(".jsonl"))
    return heapq.merge(*(_lines(join(folder, f"part-{partition:05d}", name)) for name in names), key=_key)
