"""Joining decisions back onto documents, one input file per task, streaming both sides.

A decision task holds at most ``record_buffer`` decisions: it writes them as runs sorted by
position, one per file they name (:mod:`~marin.curation.dedup.record_runs`, partition = file).
The join task of file f reads the file's documents in order and merges its runs by position (one
line of each run in memory), so each document meets its decisions as it streams past: neither
side of the join is ever held whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from zephyr import Dataset
from zephyr.worker_context import current_worker_context

from marin.curation.dedup.record_runs import RecordRuns, merged
from marin.curation.dedup.records import Decision, Doc, FileDocs, annotate_document


@dataclass(frozen=True)
class DecisionRuns:
    """map_shard function: a shard's decisions -> runs sorted by position, per file, under ``folder``."""

    folder: str
    buffer: int

    def __call__(self, decisions: Iterator[Decision]) -> Iterator[dict]:
        shard = current_worker_context().shard_index
        runs = RecordRuns(self.folder, shard, self.buffer)
        total = 0
        for decision in decisions:
            runs.add(decision.file, decision.position, decision.attributes)
            total += 1
        yield {"shard": shard, "decisions": total, "runs": runs.close()}


@dataclass(frozen=True)
class JoinedFile:
    """One input file's documents, in order, each written by ``annotate(doc, its decisions' attributes)``."""

    source: FileDocs
    folder: str
    annotate: Callable[[Doc, list[dict]], Any]

    def __call__(self) -> Iterator[Any]:
        decisions = merged(self.folder, self.source.file)
        pending = next(decisions, None)
        for doc in self.source():
            decided = []
            while pending is not None and pending[0] == doc.position:
                decided.append(pending[1])
                pending = next(decisions, None)
            yield self.annotate(doc, decided)


def joined_dataset(sources: Sequence[FileDocs], folder: str, annotate: Callable[[Doc, list[dict]], Any] | None) -> Dataset:
    """Every input file's documents with their decisions (written under ``folder`` by :class:`DecisionRuns`)."""
    return Dataset.from_shards([JoinedFile(source, folder, annotate or annotate_document) for source in sources])
