"""Count the matrix-multiply FLOPs of one training step, per chip, from the program JAX lowered.

XLA's own cost analysis of a compiled program counts the body of a loop once: a step that scans
over 32 layers is costed as if it had one. The count here reads the lowered program
(``lowered.as_text(dialect="hlo")``, before the compiler partitions or fuses anything) and adds,
for every ``dot``, ``ragged-dot`` and ``convolution``, two FLOPs per multiply-add times the number
of times one step runs it (:mod:`levanter.trainer.hlo_text`: loop bodies by their trip counts).
What the remat policy recomputes is in that program (the backward pass holds the forward ops it
reruns), so it is counted; the element-wise work (norms, activations, the optimizer's update) is
not: on a TPU it runs on the vector unit beside the matrix units and is small beside the matmuls.

The lowered program is the whole step over the global arrays; one chip's share is its FLOPs over
the number of chips (every array the step multiplies is split over the mesh). The bodies of
``shard_map`` are the exception: their shapes are already one device's along the mesh axes the
map is manual over, so they count that many times more towards each chip's share.

Pallas kernels (``tpu_custom_call``: splash attention) are programs XLA does not look inside. They
are counted apart, by kernel and calls per step, and their FLOPs are not in the count: a model's
own arithmetic (``flops_per_token``) says what attention costs.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from levanter.trainer.hlo_text import Computation, Instruction, array_dims, operand_name, parse_hlo

MATMUL_OPCODES = ("dot", "ragged-dot", "convolution")

_MESH = re.compile(r'sdy\.mesh<\[([^\]]*)\]>')
_MESH_AXIS = re.compile(r'\\?"([\w\-]+)\\?"=(\d+)')
_MANUAL_AXES = re.compile(r'manual_axes\{([^}]*)\}')
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_RAGGED = re.compile(r"lhs_ragged_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=\w+_(\w+)->")
_KERNEL_TARGET = 'custom_call_target="tpu_custom_call"'
# A shard_map's body, as JAX names it in the lowered program.
_MANUAL_BODY = "xla.sdy.manual_computation_body"


@dataclass(frozen=True)
class StepFlops:
    """The matmul FLOPs of one step on one chip, and the Pallas kernels they leave out."""

    per_chip: float
    kernels: dict[str, int] = field(default_factory=dict)  # kernel -> calls per step on one chip (FLOPs not counted)

    def summary(self) -> dict:
        return {"per_chip": self.per_chip, "kernels_not_counted": dict(self.kernels)}


def count_step_flops(lowered_hlo_text: str, num_devices: int) -> StepFlops:
    """The FLOPs of every matmul in ``lowered_hlo_text`` (see the module docstring), per chip of ``num_devices``."""
    program = parse_hlo(lowered_hlo_text)
    declared = _MESH.search(lowered_hlo_text)  # the mesh's axes and sizes, as the program declares them
    mesh = {axis: int(size) for axis, size in _MESH_AXIS.findall(declared.group(1))} if declared else {}
    # Weighted by how many devices' worth of the global arrays each computation's shapes stand for.
    shares = program.executions(scale=lambda caller, instruction, callee: _local_factor(caller, instruction, callee, mesh))
    calls = program.executions()
    total = 0.0
    kernels: dict[str, int] = defaultdict(int)
    for name, computation in program.computations.items():
        if not calls.get(name):
            continue
        shapes = computation.shapes()
        for instruction in computation.instructions:
            if instruction.opcode in MATMUL_OPCODES:
                total += shares[name] * _matmul_flops(instruction, shapes)
            elif instruction.opcode == "custom-call" and _KERNEL_TARGET in instruction.attributes:
                kernels[_kernel_name(name)] += int(calls[name])
    return StepFlops(per_chip=total / num_devices, kernels=dict(kernels))


def _matmul_flops(instruction: Instruction, shapes: dict[str, str]) -> float:
    """2 x (elements of the result) x (multiply-adds per element)."""
    result = array_dims(instruction.shape)
    if result is None or not instruction.operands:
        return 0.0
    if instruction.opcode == "convolution":
        kernel = _operand_dims(instruction.operands[1], shapes) if len(instruction.operands) > 1 else None
        labels = _DIM_LABELS.search(instruction.attributes)
        if kernel is None or labels is None or "o" not in labels.group(1):
            return 0.0
        # Each output element sums over the kernel's window and input features: all of it but its output features.
        per_element = math.prod(kernel) // kernel[labels.group(1).index("o")]
    else:  # dot, ragged-dot: each output element sums over the left operand's contracting dimensions
        lhs = _operand_dims(instruction.operands[0], shapes)
        contracting = _CONTRACTING.search(instruction.attributes)
        if lhs is None or contracting is None:
            return 0.0
        dims = [int(d) for d in contracting.group(1).split(",") if d]
        per_element = math.prod(lhs[d] for d in dims)
        ragged = _RAGGED.search(instruction.attributes)
        if ragged and any(int(d) in dims for d in ragged.group(1).split(",") if d):
            # Ragged along the summed dimension (a weight gradient per group): the result holds one
            # [K, N] per group, each summing only its group's rows, so 1/groups of the rows per element.
            groups = _operand_dims(instruction.operands[2], shapes) if len(instruction.operands) > 2 else None
            per_element /= groups[-1] if groups else 1
    return 2.0 * math.prod(result) * per_element


def _operand_dims(operand: str, shapes: dict[str, str]) -> list[int] | None:
    shape = operand if "[" in operand else shapes.get(operand_name(operand), "")
    return array_dims(shape)


def _local_factor(caller: Computation, instruction: Instruction, callee: str, mesh: dict[str, int]) -> int:
    """How many devices' worth of data the shapes of ``callee`` hold less than its caller's: the sizes of
    the mesh axes a ``shard_map`` is manual over, for its body; 1 for every other call."""
    if not callee.startswith(_MANUAL_BODY):
        return 1
    axes = _manual_axes(caller, instruction)
    if axes is None:  # the axes were not found: a map over the whole mesh, the common case
        axes = list(mesh)
    return math.prod(mesh.get(axis, 1) for axis in axes)


def _manual_axes(caller: Computation, call: Instruction) -> list[str] | None:
    """The axes named by the ``GlobalToLocalShape`` that hands a ``shard_map`` body its operands."""
    defined = {instruction.name: instruction for instruction in caller.instructions}
    for operand in call.operands:
        source = defined.get(operand_name(operand))
        if source is not None and source.opcode == "get-tuple-element" and source.operands:
            source = defined.get(operand_name(source.operands[0]))
        if source is not None and "GlobalToLocalShape" in source.attributes:
            found = _MANUAL_AXES.search(source.attributes.replace('\\"', '"'))
            if found:
                return re.findall(r'"([\w\-]+)"', found.group(1))
    return None


def _kernel_name(computation: str) -> str:
    """``_splash_attention_5.17`` -> ``splash_attention``: the function JAX lowered the kernel in."""
    return re.sub(r"(_\d+)?(\.\d+)?$", "", computation).strip("_") or computation


__all__ = ["StepFlops", "count_step_flops", "MATMUL_OPCODES"]
