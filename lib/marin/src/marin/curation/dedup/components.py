"""Near duplicates, second half: connected components of the verified edges, by min-label propagation.

Nodes are the documents that have edges, partitioned by a hash of their id. Every exchange goes
through runs sorted by node id (:mod:`~marin.curation.dedup.record_runs`), so a task holds one
node at a time plus its write buffer, never a partition's nodes:

* adjacency: each edge tells both ends of the other (and its own end of the evidence); a
  partition's merged messages become its node states (id, file, position, label = the smallest id
  among itself and its neighbours, neighbours, evidence), written in id order;
* each round: every state sends its label to its neighbours' partitions; a partition merges those
  messages with its states (both in id order) and keeps the smallest label; rounds repeat until
  none changes.

A component's label is then its smallest id: that document is kept, every other member is a
``near-duplicate`` of it, with the neighbour it was most similar to as evidence.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rigging.filesystem import atomic_open, filesystem, join, open_url
from zephyr import Dataset
from zephyr.readers import read_jsonl
from zephyr.worker_context import count

from marin.curation.dedup.record_runs import RecordRuns, merged, partition_of
from marin.curation.dedup.records import Decision
from marin.curation.dedup.spill import SpillSettings
from marin.errors import MarinError

logger = logging.getLogger(__name__)


class DedupNotConvergedError(MarinError, RuntimeError):
    """Label propagation still changed labels after the maximum number of rounds."""


def _states(folder: str, partition: int) -> str:
    return join(folder, f"part-{partition:05d}.jsonl")


@dataclass(frozen=True)
class EdgeMessages:
    """Adjacency for one edge file: each end of an edge learns of the other."""

    edges: str
    folder: str
    partitions: int
    settings: SpillSettings
    source: int

    def __call__(self) -> Iterator[dict]:
        runs = RecordRuns(self.folder, self.source, self.settings.record_buffer)
        fs, path = filesystem(self.edges)
        for edge in read_jsonl(self.edges, on_error="raise") if fs.size(path) else ():  # a shard may find no edges
            runs.add(partition_of(edge["id"], self.partitions), edge["id"],
                     [edge["file"], edge["position"], edge["root"], [edge["similarity"], edge["similar_to"]]])
            if edge["root"] != edge["id"]:
                runs.add(partition_of(edge["root"], self.partitions), edge["root"],
                         [edge["root_file"], edge["root_position"], edge["id"], None])
        yield {"source": self.source, "runs": runs.close()}


@dataclass(frozen=True)
class InitialStates:
    """A partition's node states from its adjacency messages, written in id order."""

    messages: str
    states: str
    partition: int

    def __call__(self) -> Iterator[dict]:
        nodes = 0
        with atomic_open(_states(self.states, self.partition), "w") as out:
            for node, group in _by_key(merged(self.messages, self.partition)):
                neighbours: set[str] = set()
                evidence = file = position = None
                for file, position, neighbour, found in group:
                    if neighbour != node:
                        neighbours.add(neighbour)
                    if found is not None and (evidence is None or found > evidence):
                        evidence = found
                ordered = sorted(neighbours)
                out.write(json.dumps({"id": node, "file": file, "position": position, "label": min([node, *ordered]),
                                      "neighbours": ordered, "evidence": evidence}) + "\n")
                nodes += 1
        yield {"partition": self.partition, "nodes": nodes}


@dataclass(frozen=True)
class SendLabels:
    """One round's messages from a partition: each state's label to each of its neighbours."""

    states: str
    messages: str
    partition: int
    partitions: int
    settings: SpillSettings

    def __call__(self) -> Iterator[dict]:
        runs = RecordRuns(self.messages, self.partition, self.settings.record_buffer)
        for state in _read_states(self.states, self.partition):
            for neighbour in state["neighbours"]:
                runs.add(partition_of(neighbour, self.partitions), neighbour, state["label"])
        yield {"partition": self.partition, "runs": runs.close()}


@dataclass(frozen=True)
class Relabel:
    """A partition's states, each with the smallest of its label and the labels sent to it."""

    states: str
    messages: str
    relabelled: str
    partition: int

    def __call__(self) -> Iterator[dict]:
        incoming = _by_key(merged(self.messages, self.partition))
        pending = next(incoming, None)
        changed = 0
        with atomic_open(_states(self.relabelled, self.partition), "w") as out:
            for state in _read_states(self.states, self.partition):
                label = state["label"]
                while pending is not None and pending[0] <= state["id"]:
                    if pending[0] == state["id"]:
                        label = min(label, *pending[1])
                    pending = next(incoming, None)
                if label != state["label"]:
                    changed += 1
                    count("components/changed")
                out.write(json.dumps({**state, "label": label}) + "\n")
        yield {"partition": self.partition, "changed": changed}


def _read_states(folder: str, partition: int) -> Iterator[dict]:
    with open_url(_states(folder, partition), "rb") as handle:
        for line in handle:
            yield json.loads(line)


def _by_key(items: Iterator[list]) -> Iterator[tuple[Any, list]]:
    """Consecutive ``[key, value]`` items as ``(key, [values])``: one key's values at a time."""
    key, values = None, []
    for item_key, value in items:
        if values and item_key != key:
            yield key, values
            values = []
        key = item_key
        values.append(value)
    if values:
        yield key, values


def _run(tasks: list, folder: str, backend: Any) -> dict[str, int]:
    result = Dataset.from_shards(tasks).write_jsonl(join(folder, "summary-{shard:05d}.jsonl"), backend=backend)
    return dict(result.counters)


def _component_decision(state: dict) -> Decision:
    label = state["label"]
    attributes: dict[str, Any] = {"cluster": label}
    if label != state["id"]:
        count("fuzzy/near_duplicates")
        similarity, similar_to = state["evidence"] if state["evidence"] else (None, None)
        attributes.update({"kept": False, "reason": "near-duplicate",
                           "similar_to": similar_to, "similarity": similarity})
    return Decision(state["file"], state["position"], attributes)


@dataclass(frozen=True)
class _StateDecisions:
    folder: str
    partition: int

    def __call__(self) -> Iterator[Decision]:
        return map(_component_decision, _read_states(self.folder, self.partition))


def component_decisions(edge_files: Sequence[str], work: str, backend: Any, partitions: int, settings: SpillSettings,
                        max_rounds: int = 100) -> tuple[Dataset, dict[str, int]]:
    """Decisions for every document with an edge in ``edge_files`` (jsonl), and the number of rounds."""
    adjacency, states = join(work, "adjacency"), join(work, "round-000")
    _run([EdgeMessages(url, adjacency, partitions, settings, i) for i, url in enumerate(edge_files)], adjacency, backend)
    _run([InitialStates(adjacency, states, p) for p in range(partitions)], states, backend)
    for round_index in range(1, max_rounds + 1):
        messages, relabelled = join(work, f"messages-{round_index:03d}"), join(work, f"round-{round_index:03d}")
        _run([SendLabels(states, messages, p, partitions, settings) for p in range(partitions)], messages, backend)
        changed = _run([Relabel(states, messages, relabelled, p) for p in range(partitions)], relabelled,
                       backend).get("components/changed", 0)
        states = relabelled
        logger.info("dedup: label propagation round %d changed %d labels", round_index, changed)
        if changed == 0:
            break
    else:
        raise DedupNotConvergedError(f"connected components did not converge in {max_rounds} rounds")
    decisions = Dataset.from_shards([_StateDecisions(states, p) for p in range(partitions)])
    return decisions, {"components/rounds": round_index}
