"""Joining decisions back onto documents, one input file per task, streaming both sides.

A decision task holds at most ``decision_buffer`` decisions: it sorts them by (file, position)
and writes, for each file they name, one sorted run (``file-<f>/from-<shard>-run-<n>.jsonl``).
The join task of file f reads the file's documents in order and merges its runs by position
(``heapq.merge``, one line of each run in memory), so each document meets its decisions as it
streams past: neither side of the join is ever held whole.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rigging.filesystem import atomic_open, filesystem, join, open_url
from zephyr import Dataset
from zephyr.worker_context import current_worker_context

from marin.curation.dedup.records import Decision, Doc, FileDocs, annotate_document


@dataclass(frozen=True)
class DecisionRuns:
    """map_shard function: a shard's decisions -> sorted runs per file under ``folder``; yields a summary."""

    folder: str
    buffer: int

    def __call__(self, decisions: Iterator[Decision]) -> Iterator[dict]:
        shard = current_worker_context().shard_index
        held: list[Decision] = []
        runs = total = 0
        for decision in decisions:
            held.append(decision)
            total += 1
            if len(held) >= self.buffer:
                self._write(held, shard, runs)
                held, runs = [], runs + 1
        if held:
            self._write(held, shard, runs)
            runs += 1
        yield {"shard": shard, "decisions": total, "runs": runs}

    def _write(self, held: list[Decision], shard: int, run: int) -> None:
        held.sort(key=_file_and_position)  # stable: one document's decisions keep their order
        for file, decisions in itertools.groupby(held, key=_file_of):
            url = join(self.folder, f"file-{file:05d}", f"from-{shard:05d}-run-{run:05d}.jsonl")
            with atomic_open(url, "w") as handle:
                handle.writelines(json.dumps([d.position, d.attributes]) + "\n" for d in decisions)


def _file_and_position(decision: Decision) -> tuple[int, int]:
    return decision.file, decision.position


def _file_of(decision: Decision) -> int:
    return decision.file


def _position(item: list) -> int:
    return item[0]


def _run_items(url: str) -> Iterator[list]:
    with open_url(url, "rb") as handle:
        for line in handle:
            yield json.loads(line)


def _runs_of(folder: str, file: int) -> list[str]:
    fs, path = filesystem(join(folder, f"file-{file:05d}"))
    if not fs.exists(path):
        return []
    return [join(folder, f"file-{file:05d}", name.rsplit("/", 1)[-1])
            for name in sorted(fs.ls(path, detail=False)) if name.endswith(".jsonl")]


@dataclass(frozen=True)
class JoinedFile:
    """One input file's documents, in order, each written by ``annotate(doc, its decisions' attributes)``."""

    source: FileDocs
    folder: str
    annotate: Callable[[Doc, list[dict]], Any]

    def __call__(self) -> Iterator[Any]:
        merged = heapq.merge(*(_run_items(url) for url in _runs_of(self.folder, self.source.file)), key=_position)
        pending = next(merged, None)
        for doc in self.source():
            decided = []
            while pending is not None and pending[0] == doc.position:
                decided.append(pending[1])
                pending = next(merged, None)
            yield self.annotate(doc, decided)


def joined_dataset(sources: Sequence[FileDocs], folder: str, annotate: Callable[[Doc, list[dict]], Any] | None) -> Dataset:
    """Every input file's documents with their decisions (written under ``folder`` by :class:`DecisionRuns`)."""
    return Dataset.from_shards([JoinedFile(source, folder, annotate or annotate_document) for source in sources])
