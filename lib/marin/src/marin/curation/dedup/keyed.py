"""Grouping documents by keys in two sharded stages, neither holding a shard's documents or keys.

Stage 1 (one task per input shard): documents stream past in batches of ``batch_docs``; a key
function gives each document its keys (a content hash, its LSH band keys, its line hashes); the
documents' ids (and signatures) go to a :mod:`~marin.curation.dedup.doc_table` and the keyed
entries to sorted runs (:mod:`~marin.curation.dedup.spill`). Stage 2 (one task per key
partition): the runs of every shard are merged in key order, and each group of entries sharing a
key with at least ``min_size`` members is handed, with its members' ids, files, positions (and
signatures) read back from the tables, to a reducer whose items are the stage's output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
from rigging.filesystem import join
from zephyr import Dataset

from marin.curation.dedup.doc_table import TableReader, TableWriter
from marin.curation.dedup.records import Doc, FileDocs, considered
from marin.curation.dedup.spill import (
    ENTRY,
    RunWriter,
    SpillSettings,
    groups,
    list_runs,
    merge_sorted,
    read_run,
    remove_run,
)


class KeyBatch(NamedTuple):
    """Keys of a batch of documents: entry i is (``key[i]``, ``key2[i]``) of document ``doc[i]``."""

    key: np.ndarray
    key2: np.ndarray
    doc: np.ndarray
    signatures: np.ndarray | None = None


class Keys(Protocol):
    """Makes a shard's key function (which may keep state across batches, such as a hash cache)."""

    num_perm: int  # signature width stored per document (0: none)

    def open(self) -> Any: ...  # returns a callable: list[Doc] -> KeyBatch


class Member(NamedTuple):
    id: str
    file: int
    position: int
    signature: np.ndarray | None


@dataclass(frozen=True)
class SpillShard:
    """Stage 1 for one input shard: its documents to a table, their keys to sorted runs."""

    source: FileDocs
    keys: Any
    folder: str
    partitions: int
    settings: SpillSettings

    def __call__(self) -> Iterator[dict]:
        shard = self.source.file
        runs_folder = join(self.folder, "runs")
        for stale in list_runs(runs_folder):  # a retried task starts afresh
            if stale.rsplit("/", 1)[-1].startswith(f"shard-{shard:05d}-"):
                remove_run(stale)
        runs = RunWriter(runs_folder, shard, self.partitions, self.settings)
        table = TableWriter(join(self.folder, "tables"), shard, self.keys.num_perm > 0)
        key_batch = self.keys.open()
        batch: list[Doc] = []
        try:
            for doc in self.source():
                if considered(doc):
                    batch.append(doc)
                    if len(batch) == self.settings.batch_docs:
                        self._spill(batch, key_batch, runs, table, shard)
                        batch = []
            if batch:
                self._spill(batch, key_batch, runs, table, shard)
        finally:
            table.close()
        yield {"shard": shard, "documents": table.count, "runs": len(runs.close())}

    @staticmethod
    def _spill(batch: list[Doc], key_batch: Any, runs: RunWriter, table: TableWriter, shard: int) -> None:
        keys: KeyBatch = key_batch(batch)
        ordinals = table.add([d.position for d in batch], [d.id for d in batch], keys.signatures)
        entries = np.empty(len(keys.key), dtype=ENTRY)
        entries["key"], entries["key2"] = keys.key, keys.key2
        entries["shard"], entries["ordinal"] = shard, ordinals[keys.doc]
        runs.add(entries)


@dataclass(frozen=True)
class GroupShard:
    """Stage 2 for one key partition: ``reducer(key, key2, members)`` for each large enough group."""

    folder: str
    partition: int
    reducer: Any
    min_size: int
    num_perm: int
    settings: SpillSettings

    def __call__(self) -> Iterator[Any]:
        streams = [read_run(run, self.partition, self.partition + 1, self.settings.read_chunk)
                   for run in list_runs(join(self.folder, "runs"))]
        tables = TableReader(join(self.folder, "tables"), self.num_perm)
        # Members read back recently: a document is usually in several of a partition's groups.
        known: dict[tuple[int, int], Member] = {}
        try:
            for group in groups(merge_sorted(streams), self.min_size):
                members = []
                for shard, ordinal in zip(group["shard"].tolist(), group["ordinal"].tolist()):
                    member = known.get((shard, ordinal))
                    if member is None:
                        if len(known) >= self.settings.lookup_batch:
                            known.clear()
                        position, identifier = tables.read(shard, ordinal)
                        signature = tables.signature(shard, ordinal) if self.num_perm else None
                        member = known[(shard, ordinal)] = Member(identifier, shard, position, signature)
                    members.append(member)
                yield from self.reducer(int(group["key"][0]), int(group["key2"][0]), members)
        finally:
            tables.close()


def keyed_groups(sources: Sequence[FileDocs], keys: Any, reducer: Any, folder: str, backend: Any,
                 partitions: int, settings: SpillSettings, min_size: int = 2) -> tuple[Dataset, dict[str, int]]:
    """Run stage 1 now; return stage 2 as a dataset of the reducer's items, and stage 1's counters."""
    spilled = Dataset.from_shards([SpillShard(source, keys, folder, partitions, settings) for source in sources])
    result = spilled.write_jsonl(join(folder, "spilled", "part-{shard:05d}.jsonl"), backend=backend)
    grouped = Dataset.from_shards([GroupShard(folder, p, reducer, min_size, keys.num_perm, settings)
                                   for p in range(partitions)])
    return grouped, dict(result.counters)
