"""The dedup passes: exact documents, and MinHash near duplicates with sharded components.

Each pass computes :class:`~marin.curation.dedup.records.Decision` items and :func:`run_pass`
joins them back onto the documents (:mod:`~marin.curation.dedup.join`). Keys are grouped through
:mod:`~marin.curation.dedup.keyed`: sorted runs on scratch merged per key partition, so a worker's
memory is set by :class:`~marin.curation.dedup.spill.SpillSettings`, not by its shard's size.

Exact: a document's key is the 128-bit BLAKE2b digest of its normalised text; each group of two or
more keeps its smallest id. Near duplicates: LSH buckets give verified edges
(:mod:`~marin.curation.dedup.buckets`), and the connected components of all edges
(:mod:`~marin.curation.dedup.components`) keep each component's smallest id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rigging.filesystem import join as join_url
from zephyr import Dataset
from zephyr.worker_context import count

from marin.curation.dedup.buckets import BandKeys, BucketEdges
from marin.curation.dedup.components import component_decisions
from marin.curation.dedup.join import DecisionRuns, joined_dataset
from marin.curation.dedup.keyed import KeyBatch, Member, keyed_groups
from marin.curation.dedup.minhash import MinHashConfig, normalize_text
from marin.curation.dedup.records import Decision, Doc, FileDocs
from marin.curation.dedup.spill import SpillSettings
from marin.curation.steps import CuratedDataset, CurationSink, write_curated



def _write_items(dataset: Dataset, folder: str, backend: Any) -> tuple[list[str], dict[str, int]]:
    result = dataset.write_jsonl(join_url(folder, "part-{shard:05d}.jsonl"), backend=backend)
    return list(result.outputs), dict(result.counters)


def run_pass(sources: Sequence[FileDocs], decisions: Dataset, work: str, sink: CurationSink, backend: Any,
             settings: SpillSettings, annotate: Any = None, details: Callable[[dict[str, int]], dict] | None = None,
             counters: Mapping[str, int] | None = None) -> CuratedDataset:
    """Write ``decisions`` to ``work`` as sorted runs per file, join them onto the documents, write through ``sink``.

    ``annotate(doc, attributes)`` writes one document (default: its decisions' attributes merged
    onto it); ``details`` gets the counters of earlier passes (``counters``), of the decisions and
    of the join.
    """
    runs = join_url(work, "runs")
    _, decided = _write_items(decisions.map_shard(DecisionRuns(runs, settings.record_buffer)),
                              join_url(work, "summary"), backend)
    earlier = {**(counters or {}), **decided}
    return write_curated(joined_dataset(sources, runs, annotate), sink, backend=backend,
                         details=(lambda written: details({**earlier, **written})) if details else None)


# -- exact ----------------------------------------------------------------------------------------


def _digest(text: str) -> bytes:
    return hashlib.blake2b(normalize_text(text).encode("utf-8"), digest_size=16).digest()


def content_hash(text: str) -> str:
    return _digest(text).hex()


@dataclass(frozen=True)
class ContentKeys:
    """Keys of a batch: each document's 128-bit content digest, as two 64-bit halves."""

    num_perm: int = 0

    def open(self) -> ContentKeys:
        return self

    def __call__(self, docs: list[Doc]) -> KeyBatch:
        digests = b"".join(_digest(doc.text) for doc in docs)
        halves = np.frombuffer(digests, dtype=">u8").reshape(len(docs), 2).astype(np.uint64)
        return KeyBatch(halves[:, 0].copy(), halves[:, 1].copy(), np.arange(len(docs), dtype=np.int64))


def exact_group(key: int, key2: int, found: list[Member]) -> list[Decision]:
    """A group of equal digests: the smallest id is kept, the others are exact duplicates of it."""
    members = sorted((m.id, m.file, m.position) for m in found)
    keeper = members[0][0]
    out = [Decision(members[0][1], members[0][2], {"cluster": keeper, "duplicates": len(members) - 1})]
    for _identifier, file, position in members[1:]:
        count("exact/duplicates")
        out.append(Decision(file, position, {"kept": False, "reason": "exact-duplicate", "cluster": keeper}))
    return out


def exact_decisions(sources: Sequence[FileDocs], folder: str, backend: Any, partitions: int,
                    settings: SpillSettings) -> tuple[Dataset, dict[str, int]]:
    """Documents whose normalised text is identical: the smallest id is kept."""
    return keyed_groups(sources, ContentKeys(), exact_group, folder, backend, partitions, settings)


# -- near duplicates -------------------------------------------------------------------------------


def fuzzy_decisions(sources: Sequence[FileDocs], config: MinHashConfig, bands: int, rows: int, threshold: float,
                    work: str, backend: Any, num_shards: int, settings: SpillSettings,
                    max_rounds: int = 100) -> tuple[Dataset, dict[str, int]]:
    """The near-duplicate decisions (a dataset over the last round's node states) and the passes' counters."""
    edges, counters = keyed_groups(sources, BandKeys(config, bands, rows), BucketEdges(threshold),
                                   join_url(work, "buckets"), backend, num_shards, settings)
    edge_files, found = _write_items(edges, join_url(work, "edges"), backend)
    counters.update(found)
    decisions, found = component_decisions(edge_files, join_url(work, "components"), backend, num_shards, settings,
                                           max_rounds)
    return decisions, {**counters, **found}
