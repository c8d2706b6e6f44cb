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

import numpy as np

# The collective operations, by the opcode their synchronous form has in HLO text.
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "ragged-all-to-all")

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(.+?)\s([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(r"(?:calls|body|condition|to_apply)=%([\w.\-]+)")
_CALLED_LISTS = re.compile(r"(?:called_computations|branch_computations)=\{([^}]*)\}")
_BODY = re.compile(r"body=%([\w.\-]+)")
_CONDITION = re.compile(r"condition=%([\w.\-]+)")
_INT_CONSTANT = re.compile(r"=\s*[su](?:8|16|32|64)\[\]\S*\s+constant\((\d+)\)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CHANNEL = re.compile(r"channel_id=(\d+)")
_ARRAY = re.compile(r"\b(pred|s4|s8|s16|s32|s64|u4|u8|u16|u32|u64|f8e4m3fn|f8e5m2|f8e4m3|f8e4m3b11fnuz|bf16|f16|f32|f64|c64|c128)\[([\d,]*)\]")

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3b11fnuz": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
}


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


@dataclass
class _Computation:
    calls: list[tuple[str, int | str]] = field(default_factory=list)  # (callee, times per execution, or the loop's condition)
    collectives: list[tuple[str, str | None, int]] = field(default_factory=list)  # (kind, channel, result bytes)
    root_bytes: int = 0
    int_constants: list[int] = field(default_factory=list)
    compares_less_than: bool = False


def count_collectives(hlo_text: str) -> CollectiveCounts:
    """The collectives one execution of the program in ``hlo_text`` runs (see the module docstring)."""
    computations, entry = _parse(hlo_text)
    runs = _executions(computations, entry)
    by_channel: dict[str, tuple[str, int, int]] = {}  # channel -> (kind, bytes, most executions seen)
    unchanneled: list[tuple[str, int, int]] = []
    for name, computation in computations.items():
        times = runs.get(name, 0)
        if not times:
            continue
        for kind, channel, nbytes in computation.collectives:
            if name.startswith("all-reduce-scatter"):  # a reduce-scatter lowered as all-reduce + slice
                kind, nbytes = "reduce-scatter", computation.root_bytes or nbytes
            if channel is None:
                unchanneled.append((kind, nbytes, times))
            elif channel not in by_channel or by_channel[channel][2] < times:
                by_channel[channel] = (kind, nbytes, times)
    counts: dict[str, int] = defaultdict(int)
    result_bytes: dict[str, int] = defaultdict(int)
    for kind, nbytes, times in [*by_channel.values(), *unchanneled]:
        counts[kind] += times
        result_bytes[kind] += int(nbytes) * times
    return CollectiveCounts(dict(counts), dict(result_bytes))


def _parse(hlo_text: str) -> tuple[dict[str, _Computation], str | None]:
    computations: dict[str, _Computation] = {}
    entry = None
    current: _Computation | None = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header and "=" not in line.split("(")[0]:
            current = computations.setdefault(header.group(2), _Computation())
            if header.group(1):
                entry = header.group(2)
            continue
        if current is None:
            continue
        if line.strip() == "}":
            current = None
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction is None:
            continue
        shape, opcode, rest = instruction.groups()
        if line.lstrip().startswith("ROOT"):
            current.root_bytes = _bytes(shape)
        constant = _INT_CONSTANT.search(line)
        if constant:
            current.int_constants.append(int(constant.group(1)))
        if opcode == "compare" and "direction=LT" in rest:
            current.compares_less_than = True
        kind = opcode[: -len("-start")] if opcode.endswith("-start") else opcode
        if kind in COLLECTIVE_KINDS:
            channel = _CHANNEL.search(rest)
            nbytes = _bytes(shape) if not opcode.endswith("-start") else _largest_array_bytes(shape)
            current.collectives.append((kind, channel.group(1) if channel else None, nbytes))
        body, condition, trips = _BODY.search(rest), _CONDITION.search(rest), _TRIP_COUNT.search(rest)
        for callee in _CALLED.findall(rest):
            times: int | str = 1
            if body and callee == body.group(1):
                times = int(trips.group(1)) if trips else (condition.group(1) if condition else 1)
            current.calls.append((callee, times))
        for group in _CALLED_LISTS.findall(rest):
            current.calls.extend((name.strip().lstrip("%"), 1) for name in group.split(",") if name.strip())
    return computations, entry


def _executions(computations: dict[str, _Computation], entry: str | None) -> dict[str, int]:
    """How many times one execution of ``entry`` runs each computation (call graphs are acyclic)."""
    if entry is None:
        return {}
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:  # callers before callees: reverse post-order
        if name in seen or name not in computations:
            return
        seen.add(name)
        for callee, _ in computations[name].calls:
            visit(callee)
        order.append(name)

    visit(entry)
    runs: dict[str, int] = defaultdict(int)
    runs[entry] = 1
    for name in reversed(order):
        for callee, times in computations[name].calls:
            runs[callee] += runs[name] * (times if isinstance(times, int) else _trip_count(computations.get(times)))
    return runs


def _trip_count(condition: _Computation | None) -> int:
    """A loop's trip count read from its condition, ``counter < N`` with the counter from 0 (how a
    scan compiles when the compiler has not annotated the count); 1 when it is not of that form."""
    if condition is None or not condition.compares_less_than or len(condition.int_constants) != 1:
        return 1
    return max(condition.int_constants[0], 1)


def _bytes(shape: str) -> int:
    return int(sum(_DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
                   for dtype, dims in _ARRAY.findall(_without_layouts(shape))))


def _largest_array_bytes(shape: str) -> int:
    sizes = [_DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
             for dtype, dims in _ARRAY.findall(_without_layouts(shape))]
    return int(max(sizes, default=0))


def _without_layouts(shape: str) -> str:
    """``bf16[8,16]{1,0:T(8,128)}`` -> ``bf16[8,16]``: layouts hold brackets of their own."""
    return re.sub(r"\{[^{}]*\}", "", shape)
