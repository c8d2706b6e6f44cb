"""The dedup passes on zephyr: exact documents, and MinHash near-duplicates with sharded components.

Each pass reads the input documents, computes :class:`~marin.curation.dedup.records.Decision` items
through ``group_by`` stages (no process ever holds a dictionary of all documents), writes them under
a work folder, and :func:`run_pass` joins them back onto the documents.

Near duplicates: per shard, signatures are computed in batches; every document has one entry per
LSH band keyed by ``(band, band hash)``, and entries travel through ``group_by`` batched by a
partition of that key, so a bucket's entries always meet in one reducer; a bucket's members are
compared by signature agreement and the verified pairs of a bucket become a spanning forest of edges
(member -> smallest id of its local component). Connected components of all edges come from sharded
min-label propagation: each round is one ``group_by`` over nodes, and rounds repeat until no label
changes. Each component keeps its smallest id; every other member gets ``reason: "near-duplicate"``
(its ``cluster`` names the kept one), with the neighbour it was most similar to as evidence.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rigging.filesystem import filesystem
from rigging.filesystem import join as join_url
from zephyr import Dataset
from zephyr.readers import read_jsonl
from zephyr.worker_context import count

from marin.curation.dedup.minhash import (
    MinHashConfig,
    WordShingleHasher,
    band_keys,
    batch_shingle_hashes,
    normalize_text,
    permutations,
    signatures,
)
from marin.curation.dedup.records import (
    Decision,
    Doc,
    FileDocs,
    annotated_dataset,
    considered,
)
from marin.curation.steps import CuratedDataset, CurationSink, write_curated
from marin.errors import MarinError

logger = logging.getLogger(__name__)

_SIGNATURE_BATCH = 512
_COMPARE_BLOCK = 256
# Bucket partitions per shard of the bucket stage: a reducer holds one partition's band entries.
_PARTITIONS_PER_SHARD = 8


class DedupNotConvergedError(MarinError, RuntimeError):
    """Label propagation still changed labels after the maximum number of rounds."""


@dataclass(frozen=True)
class JsonlItems:
    """A shard source reading one jsonl file and turning each record into an item."""

    url: str
    kind: str

    def __call__(self) -> Iterator[Any]:
        for record in read_jsonl(self.url, on_error="raise") if _nonempty(self.url) else ():
            yield Decision(record["file"], record["position"], record["attributes"]) if self.kind == "decision" else record


def _nonempty(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.size(path) > 0


def _write_items(dataset: Dataset, folder: str, backend: Any) -> tuple[list[str], dict[str, int]]:
    result = dataset.write_jsonl(join_url(folder, "part-{shard:05d}.jsonl"), backend=backend)
    return list(result.outputs), dict(result.counters)


def run_pass(sources: Sequence[FileDocs], decisions: Dataset, work: str, sink: CurationSink, backend: Any,
             num_shards: int, annotate: Any = None, details: Callable[[dict[str, int]], dict] | None = None,
             counters: Mapping[str, int] | None = None) -> CuratedDataset:
    """Write ``decisions`` to ``work``, join them onto the documents and write them through ``sink``.

    ``annotate`` is the per-file join reducer (see :func:`annotated_dataset`); ``details`` gets the
    counters of earlier passes (``counters``), of the decisions and of the join.
    """
    decision_files, decided = _write_items(decisions.map(_decision_record), work, backend)
    joined = annotated_dataset(sources, [JsonlItems(url, "decision") for url in decision_files], num_shards,
                               annotate).flat_map(_identity_list)
    earlier = {**(counters or {}), **decided}
    return write_curated(joined, sink, backend=backend,
                         details=(lambda written: details({**earlier, **written})) if details else None)


def _identity_list(group: list[dict]) -> list[dict]:
    return group


def _decision_record(decision: Decision) -> dict:
    return {"file": decision.file, "position": decision.position, "attributes": decision.attributes}


# -- exact ----------------------------------------------------------------------------------------


def content_hash(text: str) -> str:
    return hashlib.blake2b(normalize_text(text).encode("utf-8"), digest_size=16).hexdigest()


def _exact_key(doc: Doc) -> tuple[str, int, int, str]:
    return (content_hash(doc.text), doc.file, doc.position, doc.id)


def _first(item: tuple) -> Any:
    return item[0]


def _exact_group(digest: str, members: Iterator[tuple]) -> list[Decision]:
    members = sorted(members, key=lambda m: (m[3], m[1], m[2]))
    if len(members) < 2:
        return []
    keeper = members[0][3]
    out = [Decision(members[0][1], members[0][2], {"cluster": keeper, "duplicates": len(members) - 1})]
    for _, file, position, _identifier in members[1:]:
        count("exact/duplicates")
        out.append(Decision(file, position, {"kept": False, "reason": "exact-duplicate",
                                             "cluster": keeper}))
    return out


def exact_decisions(sources: Sequence[FileDocs], num_shards: int) -> Dataset:
    """Documents whose normalised text is identical: the smallest id is kept."""
    return (Dataset.from_shards(sources).filter(considered).map(_exact_key)
            .group_by(_first, _exact_group, num_shards=num_shards).flat_map(_identity_list))


# -- near duplicates: buckets -------------------------------------------------------------------------


@dataclass(frozen=True)
class BandItems:
    """map_shard function: documents -> band entries, batched per bucket partition.

    Every (document, band) pair is an entry keyed by ``(band, band key)``; a batch of documents emits,
    for each of ``partitions`` partitions of the bucket keys, one item holding that partition's entries
    as arrays (with the signatures and ids of the documents they name). ``group_by`` on the partition
    brings every entry of a bucket together while per-item costs are paid per batch, not per entry.
    """

    config: MinHashConfig
    bands: int
    rows: int
    partitions: int

    def __call__(self, docs: Iterator[Doc]) -> Iterator[tuple]:
        a, b = permutations(self.config)
        hasher = WordShingleHasher(self.config.ngram, self.config.seed)
        batch: list[Doc] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) == _SIGNATURE_BATCH:
                yield from self._emit(batch, a, b, hasher)
                batch = []
        if batch:
            yield from self._emit(batch, a, b, hasher)

    def _emit(self, batch: list[Doc], a: np.ndarray, b: np.ndarray, hasher: WordShingleHasher) -> Iterator[tuple]:
        sigs = signatures(batch_shingle_hashes([doc.text for doc in batch], self.config, hasher), a, b)
        count("fuzzy/signatures", len(batch))
        keys = band_keys(sigs, self.bands, self.rows)  # documents x bands
        band_index = np.broadcast_to(np.arange(self.bands, dtype=np.uint64), keys.shape)
        part = ((keys ^ (band_index * np.uint64(0x9E3779B97F4A7C15))) % np.uint64(self.partitions)).astype(np.int64)
        for target in np.unique(part):
            doc_rows, bands = np.nonzero(part == target)
            used, local = np.unique(doc_rows, return_inverse=True)
            yield (int(target), {
                "band": bands.astype(np.int32), "key": keys[doc_rows, bands], "doc": local.astype(np.int64),
                "file": np.array([batch[i].file for i in used], dtype=np.int64),
                "position": np.array([batch[i].position for i in used], dtype=np.int64),
                "id": [batch[i].id for i in used], "sig": sigs[used],
            })


@dataclass(frozen=True)
class BucketEdges:
    """group_by reducer over one partition: buckets by ``(band, key)``, verified pairs as edges.

    Within a bucket, members are compared by signature agreement; verified pairs become a spanning
    forest (each member -> the smallest id of its local component), so a bucket of k members gives at
    most k edges, each with the member's most similar verified neighbour as evidence.
    """

    threshold: float

    def __call__(self, partition: int, items: Iterator[tuple]) -> list[dict]:
        items = [entry for _, entry in items]
        offsets = np.cumsum([0] + [len(entry["id"]) for entry in items])
        band = np.concatenate([entry["band"] for entry in items])
        key = np.concatenate([entry["key"] for entry in items])
        doc = np.concatenate([entry["doc"] + offset for entry, offset in zip(items, offsets)])
        ids = [i for entry in items for i in entry["id"]]
        files = np.concatenate([entry["file"] for entry in items])
        positions = np.concatenate([entry["position"] for entry in items])
        sigs = np.concatenate([entry["sig"] for entry in items])
        order = np.lexsort((doc, key, band))
        band, key, doc = band[order], key[order], doc[order]
        boundaries = np.flatnonzero((np.diff(band) != 0) | (np.diff(key) != 0)) + 1
        starts = np.concatenate(([0], boundaries))
        ends = np.concatenate((boundaries, [len(doc)]))
        edges: list[dict] = []
        for start, end in zip(starts, ends):
            if end - start < 2:
                continue
            count("fuzzy/candidate_buckets")
            members = sorted({ids[d]: int(d) for d in doc[start:end]}.items())
            rows = [d for _, d in members]
            edges.extend(self._bucket(rows, ids, files, positions, sigs[rows]))
        return edges

    def _bucket(self, rows: list[int], ids: list[str], files: np.ndarray, positions: np.ndarray,
                sigs: np.ndarray) -> list[dict]:
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

        def member(i: int) -> tuple:
            row = rows[i]
            return (ids[row], int(files[row]), int(positions[row]))

        edges = []
        for i in range(len(rows)):
            if i in best:
                similarity, neighbour = best[i]
                edges.append(_edge(member(i), member(root(i)), member(neighbour), similarity))
        return edges


def _edge(member: tuple, local_root: tuple, neighbour: tuple, similarity: float) -> dict:
    return {"id": member[0], "file": member[1], "position": member[2],
            "root": local_root[0], "root_file": local_root[1], "root_position": local_root[2],
            "similar_to": neighbour[0], "similarity": round(similarity, 6)}


# -- near duplicates: connected components -----------------------------------------------------------


def _node_messages(edge: dict) -> Iterator[tuple]:
    """An edge as adjacency: each end learns of the other (and the evidence for its own end)."""
    yield (edge["id"], edge["file"], edge["position"], edge["root"], (edge["similarity"], edge["similar_to"]))
    if edge["root"] != edge["id"]:
        yield (edge["root"], edge["root_file"], edge["root_position"], edge["id"], None)


def _node_id(item: tuple) -> str:
    return item[0]


def _initial_state(node: str, messages: Iterator[tuple]) -> dict:
    neighbours: set[str] = set()
    evidence: tuple[float, str] | None = None
    file = position = None
    for _, file, position, neighbour, found in messages:
        if neighbour != node:
            neighbours.add(neighbour)
        if found is not None and (evidence is None or found > evidence):
            evidence = found
    ordered = sorted(neighbours)
    return {"id": node, "file": file, "position": position, "label": min([node, *ordered]),
            "neighbours": ordered, "evidence": list(evidence) if evidence else None}


def _propagate(state: dict) -> Iterator[tuple]:
    yield (state["id"], state)
    for neighbour in state["neighbours"]:
        yield (neighbour, state["label"])


def _first_of_pair(item: tuple) -> str:
    return item[0]


def _relabel(node: str, items: Iterator[tuple]) -> dict:
    state, labels = None, []
    for _, value in items:
        if isinstance(value, dict):
            state = value
        else:
            labels.append(value)
    label = min([state["label"], *labels])
    if label != state["label"]:
        count("components/changed")
    return {**state, "label": label}


def _component_decision(state: dict) -> Decision:
    label = state["label"]
    attributes: dict[str, Any] = {"cluster": label}
    if label != state["id"]:
        count("fuzzy/near_duplicates")
        similarity, similar_to = state["evidence"] if state["evidence"] else (None, None)
        attributes.update({"kept": False, "reason": "near-duplicate",
                           "similar_to": similar_to, "similarity": similarity})
    return Decision(state["file"], state["position"], attributes)


def fuzzy_decisions(sources: Sequence[FileDocs], config: MinHashConfig, bands: int, rows: int, threshold: float,
                    work: str, backend: Any, num_shards: int, max_rounds: int = 100) -> tuple[Dataset, dict[str, int]]:
    """The near-duplicate decisions (a dataset over the last round's node states) and the passes' counters."""
    counters: dict[str, int] = {}
    partitions = num_shards * _PARTITIONS_PER_SHARD
    edges = (Dataset.from_shards(sources).filter(considered).map_shard(BandItems(config, bands, rows, partitions))
             .group_by(_first, BucketEdges(threshold), num_shards=num_shards).flat_map(_identity_list))
    edge_files, found = _write_items(edges, join_url(work, "edges"), backend)
    counters.update(found)
    states = (Dataset.from_shards([JsonlItems(url, "record") for url in edge_files]).flat_map(_node_messages)
              .group_by(_node_id, _initial_state, num_shards=num_shards))
    state_files, _ = _write_items(states, join_url(work, "round-000"), backend)
    for round_index in range(1, max_rounds + 1):
        step = (Dataset.from_shards([JsonlItems(url, "record") for url in state_files]).flat_map(_propagate)
                .group_by(_first_of_pair, _relabel, num_shards=num_shards))
        state_files, found = _write_items(step, join_url(work, f"round-{round_index:03d}"), backend)
        changed = found.get("components/changed", 0)
        logger.info("dedup: label propagation round %d changed %d labels", round_index, changed)
        if changed == 0:
            counters["components/rounds"] = round_index
            break
    else:
        raise DedupNotConvergedError(f"connected components did not converge in {max_rounds} rounds")
    decisions = Dataset.from_shards([JsonlItems(url, "record") for url in state_files]).map(_component_decision)
    return decisions, counters
