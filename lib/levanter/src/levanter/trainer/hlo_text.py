"""Read an XLA program from its HLO text: its computations, their instructions, and how many times
one execution of the program runs each computation.

Both texts a jitted function gives are read: the lowered program (``lowered.as_text(dialect="hlo")``,
before partitioning, instruction names without ``%``, each operand by name only) and the compiled
one (``compiled.as_text()``, one device's program, names with ``%``). A computation is a block of
instructions that others call: fusions, loop bodies and conditions, reducers, the bodies of
``shard_map``. A loop body runs as many times as the loop turns, which the compiler records on the
``while`` (``known_trip_count``) or, before it has, the loop's condition says (``counter < N``).
Only the first line of an instruction is read: a few (Pallas kernels) continue over several lines
with metadata that holds nothing counted here.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)")
_CALLED_LISTS = re.compile(r"(?:called_computations|branch_computations)=\{([^}]*)\}")
_BODY = re.compile(r"body=%?([\w.\-]+)")
_CONDITION = re.compile(r"condition=%?([\w.\-]+)")
_INT_CONSTANT = re.compile(r"^[su](?:8|16|32|64)\[\]\S*$")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_ARRAY = re.compile(r"\b(pred|s4|s8|s16|s32|s64|u4|u8|u16|u32|u64|f8e4m3fn|f8e5m2|f8e4m3|f8e4m3b11fnuz|bf16|f16|f32|f64|c64|c128)\[([\d,]*)\]")

DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3b11fnuz": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
}


@dataclass(frozen=True)
class Instruction:
    """One instruction: ``name = shape opcode(operands), attributes``."""

    name: str
    shape: str  # the result's shape as written: "bf16[8,512]{1,0}", or a tuple "(s32[], f32[4])"
    opcode: str
    operands: tuple[str, ...]  # each operand as written: "mul.87", or "bf16[8,512]{1,0} %mul.87"
    attributes: str  # the rest of the line after the operands
    root: bool = False

    def calls(self) -> list[tuple[str, int | str]]:
        """The computations this instruction calls, each with how many times one execution of it runs
        them: a loop body its trip count when known, else the name of the loop's condition (to read
        the count from); everything else once."""
        body, condition, trips = _BODY.search(self.attributes), _CONDITION.search(self.attributes), _TRIP_COUNT.search(self.attributes)
        called: list[tuple[str, int | str]] = []
        for callee in _CALLED.findall(self.attributes):
            times: int | str = 1
            if body and callee == body.group(1):
                times = int(trips.group(1)) if trips else (condition.group(1) if condition else 1)
            called.append((callee, times))
        for group in _CALLED_LISTS.findall(self.attributes):
            called.extend((name.strip().lstrip("%"), 1) for name in group.split(",") if name.strip())
        return called


@dataclass
class Computation:
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def shapes(self) -> dict[str, str]:
        """Each instruction's result shape by its name (operands are named, not shaped, in lowered text)."""
        return {instruction.name: instruction.shape for instruction in self.instructions}

    @property
    def root(self) -> Instruction | None:
        return next((instruction for instruction in self.instructions if instruction.root), None)


@dataclass(frozen=True)
class Program:
    computations: dict[str, Computation]
    entry: str | None

    def executions(self, scale: Callable[[Computation, Instruction, str], float] | None = None) -> dict[str, float]:
        """How many times one execution of the entry runs each computation (call graphs are acyclic).

        ``scale(caller, instruction, callee)``, when given, multiplies what each call contributes (a
        weight carried down the calls, such as the devices a ``shard_map`` body's shapes are local to).
        """
        if self.entry is None:
            return {}
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:  # callers before callees: reverse post-order
            if name in seen or name not in self.computations:
                return
            seen.add(name)
            for instruction in self.computations[name].instructions:
                for callee, _ in instruction.calls():
                    visit(callee)
            order.append(name)

        visit(self.entry)
        runs: dict[str, float] = defaultdict(int)
        runs[self.entry] = 1
        for name in reversed(order):
            caller = self.computations[name]
            for instruction in caller.instructions:
                for callee, times in instruction.calls():
                    count = times if isinstance(times, int) else self.trip_count(times)
                    factor = scale(caller, instruction, callee) if scale is not None else 1
                    runs[callee] += runs[name] * count * factor
        return runs

    def trip_count(self, condition_name: str) -> int:
        """A loop's trip count read from its condition, ``counter < N`` with the counter from 0 (how a
        scan compiles when the compiler has not annotated the count); 1 when it is not of that form."""
        condition = self.computations.get(condition_name)
        if condition is None:
            return 1
        compares_less_than = any(i.opcode == "compare" and "direction=LT" in i.attributes for i in condition.instructions)
        constants = [int(i.operands[0]) for i in condition.instructions
                     if i.opcode == "constant" and _INT_CONSTANT.match(i.shape) and i.operands and i.operands[0].isdigit()]
        if not compares_less_than or len(constants) != 1:
            return 1
        return max(constants[0], 1)


def parse_hlo(hlo_text: str) -> Program:
    """The computations of ``hlo_text`` and the name of its entry."""
    computations: dict[str, Computation] = {}
    entry = None
    current: Computation | None = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header and "=" not in line.split("(")[0]:
            current = computations.setdefault(header.group(2), Computation(header.group(2)))
            if header.group(1):
                entry = header.group(2)
            continue
        if current is None:
            continue
        if line.strip() == "}":
            current = None
            continue
        matched = _INSTRUCTION.match(line)
        if matched is None:
            continue
        root, name, shape, opcode, rest = matched.groups()
        operands, attributes = _split_operands(rest)
        current.instructions.append(Instruction(name, shape, opcode, operands, attributes, root=bool(root)))
    return Program(computations, entry)


def _split_operands(rest: str) -> tuple[tuple[str, ...], str]:
    """``a, f32[2,3]{1,0} %b), attrs`` -> (("a", "f32[2,3]{1,0} %b"), "attrs"): the operands end at the
    parenthesis that closes the opcode's; commas inside brackets and braces belong to shapes."""
    depth, start, operands = 0, 0, []
    for index, char in enumerate(rest):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:  # the opcode's closing parenthesis
                last = rest[start:index].strip()
                if last:
                    operands.append(last)
                return tuple(operands), rest[index + 1 :].lstrip(", ")
            depth -= 1
        elif char == "," and depth == 0:
            operands.append(rest[start:index].strip())
            start = index + 1
    return tuple(operands), ""


def operand_name(operand: str) -> str:
    """The name an operand refers to, without its shape or ``%``."""
    return operand.split()[-1].lstrip("%") if operand else ""


def array_dims(shape: str) -> list[int] | None:
    """The dimensions of a single array shape (``bf16[8,512]{1,0}`` -> [8, 512]); None for tuples."""
    arrays = _ARRAY.findall(without_layouts(shape))
    if len(arrays) != 1:
        return None
    return [int(d) for d in arrays[0][1].split(",") if d]


def shape_bytes(shape: str) -> int:
    """The bytes of every array in ``shape`` (a tuple's elements summed)."""
    return int(sum(DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
                   for dtype, dims in _ARRAY.findall(without_layouts(shape))))


def largest_array_bytes(shape: str) -> int:
    sizes = [DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
             for dtype, dims in _ARRAY.findall(without_layouts(shape))]
    return int(max(sizes, default=0))


def without_layouts(shape: str) -> str:
    """``bf16[8,16]{1,0:T(8,128)}`` -> ``bf16[8,16]``: layouts hold brackets of their own."""
    return re.sub(r"\{[^{}]*\}", "", shape)
