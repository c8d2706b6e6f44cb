"""The dedup passes: exact documents, and MinHash near duplicates with sharded components.

Each pass computes :class:`~marin.curation.dedup.records.Decision` items and :func:`run_pass`
joins them back onto the documents (:mod:`~marin.curation.dedup.join`). Keys are grouped through
:mod:`~marin.curation.dedup.keyed`: sorted runs on scratch merged per key partition, so a worker's
memory is set by :class:`~marin.curation.dedup.spill.SpillSettings`, not by its shard's size.

Exact: a document's key is the 128-bit BLAKE2b digest of its normalised text; each group of two or
more keeps its smallest id. Near duplicates: LSH buckets give verified edges
(:mod:`~marin.curation.dedup.buckets`); connected components of all edges come from sharded
min-label propagation: each round is one ``group_by`` over the nodes that have edges, and rounds
repeat until no label changes. Each component keeps its smallest id; every other member gets
``reason: "near-duplicate"`` (its ``cluster`` names the kept one), with the neighbour it was most
similar to as evidence.
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

from marin.curation.dedup.buckets import BandKeys, BucketEdges
from marin.curation.dedup.join import DecisionRuns, joined_dataset
from marin.curation.dedup.keyed import KeyBatch, Member, keyed_groups
from marin.curation.dedup.minhash import MinHashConfig, normalize_text
from marin.curation.dedup.records import Decision, Doc, FileDocs
from marin.curation.dedup.spill import SpillSettings
from marin.curation.steps import CuratedDataset, CurationSink, write_curated
from marin.errors import MarinError

logger = logging.getLogger(__name__)


class DedupNotConvergedError(MarinError, RuntimeError):
    """Label propagation still changed labels after the maximum number of rounds."""


@dataclass(frozen=True)
class JsonlItems:
    """A shard source reading one jsonl file of records."""

    url: str

    def __call__(self) -> Iterator[Any]:
        yield from read_jsonl(self.url, on_error="raise") if _nonempty(self.url) else ()


def _nonempty(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.size(path) > 0


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
    _, decided = _write_items(decisions.map_shard(DecisionRuns(runs, settings.decision_buffer)),
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
                    work: str, backend: Any, num_shards: int, settings: SpillSettings,
                    max_rounds: int = 100) -> tuple[Dataset, dict[str, int]]:
    """The near-duplicate decisions (a dataset over the last round's node states) and the passes' counters."""
    edges, counters = keyed_groups(sources, BandKeys(config, bands, rows), BucketEdges(threshold),
                                   join_url(work, "buckets"), backend, num_shards, settings)
    edge_files, found = _write_items(edges, join_url(work, "edges"), backend)
    counters.update(found)
    decisions, found = component_decisions(edge_files, work, backend, num_shards, max_rounds)
    return decisions, {**counters, **found}


def component_decisions(edge_files: Sequence[str], work: str, backend: Any, num_shards: int,
                        max_rounds: int = 100) -> tuple[Dataset, dict[str, int]]:
    """Connected components of the edges in ``edge_files`` (jsonl), by rounds of min-label propagation."""
    states = (Dataset.from_shards([JsonlItems(url) for url in edge_files]).flat_map(_node_messages)
              .group_by(_node_id, _initial_state, num_shards=num_shards))
    state_files, _ = _write_items(states, join_url(work, "round-000"), backend)
    for round_index in range(1, max_rounds + 1):
        step = (Dataset.from_shards([JsonlItems(url) for url in state_files]).flat_map(_propagate)
                .group_by(_first_of_pair, _relabel, num_shards=num_shards))
        state_files, found = _write_items(step, join_url(work, f"round-{round_index:03d}"), backend)
        changed = found.get("components/changed", 0)
        logger.info("dedup: label propagation round %d changed %d labels", round_index, changed)
        if changed == 0:
            break
    else:
        raise DedupNotConvergedError(f"connected components did not converge in {max_rounds} rounds")
    decisions = Dataset.from_shards([JsonlItems(url) for url in state_files]).map(_component_decision)
    return decisions, {"components/rounds": round_index}
