"""Count the collectives of a compiled program, per execution, from its optimised HLO text.

A training step's communication is decided by the compiler (SPMD partitioning inserts all-gathers
of sharded weights, reduce-scatters of gradients, ...), so the honest count is read from the
program it compiled. The HLO text is a set of computations that call one another (fusions, loop
bodies, reducers); a collective inside the body of a loop over 32 layers runs 32 times a step.
:func:`count_collectives` therefore weighs each computation by how many times one execution of the
program runs it (loop bodies by their known trip counts) and counts each collective once per
channel: an asynchronous collective appears in several clones (its start and its done), all with
the channel of the one operation they implement.

Bytes are those of each collective's result on one device (an all-gather's gathered array, a
reduce-scatter's shard), summed over executions: a measure of the traffic, not a timing.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from levanter.trainer.hlo_text import largest_array_bytes, parse_hlo, shape_bytes

# The collective operations, by the opcode their synchronous form has in HLO text.
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "ragged-all-to-all")

_CHANNEL = re.compile(r"channel_id=(\d+)")


@dataclass(frozen=True)
class CollectiveCounts:
    """Per kind of collective: how many run in one execution and the bytes of their results."""

    counts: dict[str, int] = field(default_factory=dict)
    result_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total_count(self) -> int:
        return sum(self.counts.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.result_bytes.values())

    def summary(self) -> dict[str, dict[str, int]]:
        return {kind: {"count": self.counts[kind], "bytes": self.result_bytes[kind]} for kind in sorted(self.counts)}


def count_collectives(hlo_text: str) -> CollectiveCounts:
    """The collectives one execution of the program in ``hlo_text`` runs (see the module docstring)."""
    program = parse_hlo(hlo_text)
    runs = program.executions()
    by_channel: dict[str, tuple[str, int, int]] = {}  # channel -> (kind, bytes, most executions seen)
    unchanneled: list[tuple[str, int, int]] = []
    for name, computation in program.computations.items():
        times = runs.get(name, 0)
        if not times:
            continue
        for instruction in computation.instructions:
            started = instruction.opcode.endswith("-start")
            kind = instruction.opcode.removesuffix("-start")
            if kind not in COLLECTIVE_KINDS:
                continue
            channel = _CHANNEL.search(instruction.attributes)
            nbytes = largest_array_bytes(instruction.shape) if started else shape_bytes(instruction.shape)
            if name.startswith("all-reduce-scatter"):  # a reduce-scatter lowered as all-reduce + slice
                root = computation.root
                kind, nbytes = "reduce-scatter", (shape_bytes(root.shape) if root is not None else 0) or nbytes
            if channel is None:
                unchanneled.append((kind, nbytes, times))
            elif channel.group(1) not in by_channel or by_channel[channel.group(1)][2] < times:
                by_channel[channel.group(1)] = (kind, nbytes, times)
    counts: dict[str, int] = defaultdict(int)
    result_bytes: dict[str, int] = defaultdict(int)
    for kind, nbytes, times in [*by_channel.values(), *unchanneled]:
        counts[kind] += times
        result_bytes[kind] += int(nbytes) * times
    return CollectiveCounts(dict(counts), dict(result_bytes))
