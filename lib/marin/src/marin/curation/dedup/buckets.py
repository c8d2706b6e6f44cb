"""Near duplicates, first half: LSH buckets and the verified edges within each bucket.

Every document has one keyed entry per LSH band: key = the band's hash of its signature rows,
key2 = the band's index, so a bucket is a ``(key, band)`` group and bands never share buckets.
Entries and signatures go through :mod:`~marin.curation.dedup.keyed` (sorted runs, merged per key
partition); a bucket of two or more documents reaches :class:`BucketEdges`, which compares its
members by signature agreement and writes the verified pairs as a spanning forest of edges
(member -> smallest id of its local component), with each member's most similar verified
neighbour as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from zephyr.worker_context import count

from marin.curation.dedup.keyed import KeyBatch, Member
from marin.curation.dedup.minhash import (
    MinHashConfig,
    WordShingleHasher,
    band_keys,
    batch_shingle_hashes,
    permutations,
    signatures,
)
from marin.curation.dedup.records import Doc

_COMPARE_BLOCK = 256


@dataclass(frozen=True)
class BandKeys:
    """Keys of a batch: a document's band hashes (one entry per band), with its signature for the table."""

    config: MinHashConfig
    bands: int
    rows: int

    @property
    def num_perm(self) -> int:
        return self.config.num_perm

    def open(self) -> Any:
        return _BandKeyFunction(self, *permutations(self.config), WordShingleHasher(self.config.ngram, self.config.seed))


@dataclass(frozen=True)
class _BandKeyFunction:
    spec: BandKeys
    a: np.ndarray
    b: np.ndarray
    hasher: WordShingleHasher

    def __call__(self, docs: list[Doc]) -> KeyBatch:
        spec = self.spec
        sigs = signatures(batch_shingle_hashes([doc.text for doc in docs], spec.config, self.hasher), self.a, self.b)
        count("fuzzy/signatures", len(docs))
        keys = band_keys(sigs, spec.bands, spec.rows)  # documents x bands
        band = np.broadcast_to(np.arange(spec.bands, dtype=np.uint64), keys.shape)
        doc = np.broadcast_to(np.arange(len(docs), dtype=np.int64)[:, None], keys.shape)
        return KeyBatch(keys.ravel(), band.ravel(), doc.ravel(), sigs)


@dataclass(frozen=True)
class BucketEdges:
    """Reducer over one bucket: verified pairs as a spanning forest of edges.

    Members are compared by signature agreement; verified pairs become a spanning forest (each
    member -> the smallest id of its local component), so a bucket of k members gives at most k
    edges, each with the member's most similar verified neighbour as evidence.
    """

    threshold: float

    def __call__(self, key: int, band: int, found: list[Member]) -> list[dict]:
        count("fuzzy/candidate_buckets")
        # One member per id (the first in file order, if ids repeat), sorted by id.
        rows = sorted({m.id: m for m in sorted(found, key=_place, reverse=True)}.values(), key=_id)
        if len(rows) < 2:
            return []
        if len(rows) == 2:  # most buckets: one pair, no forest to build
            similarity = np.count_nonzero(rows[0].signature == rows[1].signature) / len(rows[0].signature)
            if similarity < self.threshold:
                return []
            return [_edge(rows[0], rows[0], rows[1], similarity), _edge(rows[1], rows[0], rows[0], similarity)]
        sigs = np.stack([m.signature for m in rows])
        parent = list(range(len(rows)))
        best: dict[int, tuple[float, int]] = {}

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for start in range(0, len(rows), _COMPARE_BLOCK):
            agreement = (sigs[start:start + _COMPARE_BLOCK, None, :] == sigs[None, :, :]).mean(axis=-1)
            for offset, row in enumerate(agreement):
                i = start + offset
                for j in np.flatnonzero(row[i + 1:] >= self.threshold) + i + 1:
                    j = int(j)
                    similarity = float(row[j])
                    for x, y in ((i, j), (j, i)):
                        if x not in best or similarity > best[x][0]:
                            best[x] = (similarity, y)
                    ri, rj = root(i), root(j)
                    if ri != rj:
                        parent[max(ri, rj)] = min(ri, rj)  # members are sorted by id: smaller index, smaller id

        edges = []
        for i in range(len(rows)):
            if i in best:
                similarity, neighbour = best[i]
                edges.append(_edge(rows[i], rows[root(i)], rows[neighbour], similarity))
        return edges


def _place(member: Member) -> tuple[int, int]:
    return member.file, member.position


def _id(member: Member) -> str:
    return member.id


def _edge(member: Member, local_root: Member, neighbour: Member, similarity: float) -> dict:
    return {"id": member.id, "file": member.file, "position": member.position,
            "root": local_root.id, "root_file": local_root.file, "root_position": local_root.position,
            "similar_to": neighbour.id, "similarity": round(similarity, 6)}
