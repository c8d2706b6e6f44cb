"""Plan a training step on the TPU pod its resources name, before renting one: compile it here.

:func:`plan_step` takes a training step as ``train_lm`` (or ``sft``, ``dpo``) declared it, finds the
pod its ``with_tpu(...)`` resources name (the slice's topology from fray's accelerator table, as
libtpu describes it: ``v5litepod-256`` is ``v5e:16x16``), and compiles the trainer's own step for
that pod's devices on this machine, with no chip (:mod:`levanter.trainer.ahead_of_time`). XLA then
says how many bytes each chip holds, or refuses, naming the bytes it would need; the lowered
program says the step's FLOPs, the compiled one its collectives.

A step that does not fit gets a change that does, found by planning it
(:func:`find_fitting_change`): the next remat policy (keeping fewer activations per layer), then
microbatches of half as many rows (fewer activations alive at once), then a slice of twice the
chips, each tried in turn on top of the last, until XLA compiles one.

Several slices (``slice_count > 1``) are compiled as one program over all of their devices, each
device knowing its slice, with data parallelism across the slices as the mesh has it. One chip
(``v5litepod-1``, ``v6e-1``) is one device of a four-chip topology: libtpu describes no smaller one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fray.cluster import ResourceConfig
from fray.cluster.accelerators import tpu_slice
from fray.cluster.resources import TpuDevice
from levanter.trainer import MeshConfig, MeshConfigError
from levanter.trainer.ahead_of_time import CompiledStep, DoesNotFit, compile_train_step, tpu_topology_devices
from levanter.trainer.mesh_choice import choose_mesh, resource_devices
from marin.errors import MarinError
from marin.experiment.train_step import TrainingRequest

# The remat policies (levanter.models.transformer.REMAT_POLICIES) from the most activations kept per
# layer to the fewest; a model with another policy is not offered a stronger one.
REMAT_BY_MEMORY = ("none", "save_matmuls", "save_attention", "full")
# At most this many changes are planned in search of one that fits (each is a compile).
MAX_CHANGES_TRIED = 8


class PlanError(MarinError, ValueError):
    """A step that cannot be planned as asked (no vocabulary known, a model that cannot be built)."""


@dataclass(frozen=True)
class Pod:
    """The TPU devices a step's resources name, as this machine compiles for them."""

    resources: str  # "with_tpu('v5litepod-256')"
    tpu_type: str  # "v5litepod-256"
    topology: str  # "v5e:16x16"
    slices: int
    chips: int  # of every slice together
    hbm_bytes: int  # of one chip
    note: str = ""  # how the devices compiled for differ from the pod's, when they do

    def devices(self) -> list:
        if self.chips == 1:
            return tpu_topology_devices(self.topology)[:1]
        return tpu_topology_devices(self.topology, slices=self.slices)


def pod_of(resources: ResourceConfig | None) -> Pod | None:
    """The pod ``resources`` name, or None when they are not TPUs."""
    device = getattr(resources, "device", None)
    if not isinstance(device, TpuDevice):
        return None
    tpu = tpu_slice(device.type)
    topology, note = tpu.topology, ""
    if tpu.chips == 1:
        topology, note = f"{tpu.generation.chip}:2x2", "one chip: one device of a 2x2 topology (libtpu describes no smaller one)"
    return Pod(resources=resource_devices(resources).resources, tpu_type=tpu.name, topology=topology,
               slices=device.slice_count, chips=tpu.chips * device.slice_count, hbm_bytes=tpu.hbm_bytes_per_chip, note=note)


@dataclass(frozen=True)
class StepPlan:
    """One training step compiled for its pod: what XLA said, and what it was asked to compile."""

    step: str
    pod: Pod
    request: TrainingRequest
    vocab_size: int
    result: CompiledStep | DoesNotFit

    @property
    def fits(self) -> bool:
        return self.result.fits

    @property
    def mesh(self) -> MeshConfig:
        return self.request.trainer.mesh

    @property
    def per_chip_bytes(self) -> int | None:
        """What one chip holds at the step's peak (compiled: XLA's peak, else the sum of its parts),
        or what XLA asked for (refused)."""
        if isinstance(self.result, CompiledStep):
            return self.result.memory.peak or self.result.memory.total
        return self.result.needed_bytes

    @property
    def available_bytes(self) -> int:
        """The chip's memory as XLA counts it (what its runtime leaves), else as the provider lists it."""
        return getattr(self.result, "available_bytes", None) or self.pod.hbm_bytes

    @property
    def flops_per_chip(self) -> float | None:
        flops = self.result.step_flops
        return flops.per_chip if flops is not None else None

    @property
    def caveat(self) -> str:
        """What the compiled step leaves out of the step that will run, when anything."""
        left_out = [what for what, present in (("LoRA's adapters (the plan trains every weight)", self.request.lora),
                                               ("DPO's reference model pass", self.request.dpo)) if present is not None]
        return f"compiled as language-model training; not in the plan: {', '.join(left_out)}" if left_out else ""

    @property
    def model_flops_per_step(self) -> float | None:
        """The model's own count (``flops_per_token``: 6N plus attention) for one step's tokens, all chips."""
        count = getattr(self.request.model, "flops_per_token", None)
        tokens = self.request.trainer.batch_size * self.request.seq_len
        return float(count(self.vocab_size, self.request.seq_len)) * tokens if callable(count) else None


@dataclass(frozen=True)
class Change:
    """A change to the step's ``train_lm(...)`` arguments, and its plan."""

    settings: dict[str, Any]  # train_lm keyword -> value; "model.remat" for a field of the model config
    plan: StepPlan

    def describe(self) -> str:
        """The change as ``train_lm``'s arguments: ``model=dataclasses.replace(model, remat='full'), microbatch_size=64``."""
        written = []
        for key, value in self.settings.items():
            if key.startswith("model."):
                written.append(f"model=dataclasses.replace(model, {key.removeprefix('model.')}={value!r})")
            elif key == "resources":
                written.append(f"resources=ResourceConfig.{value}")
            else:
                written.append(f"{key}={value!r}")
        return ", ".join(written)


def plan_step(step: str, request: TrainingRequest, resources: ResourceConfig, vocab_size: int) -> StepPlan:
    """Compile ``request``'s training step for the pod ``resources`` name (which must be TPUs)."""
    pod = pod_of(resources)
    if pod is None:
        raise PlanError(f"Step {step!r} runs on {resource_devices(resources).resources}: compiling ahead is for TPUs.")
    if not callable(getattr(request.model, "build", None)):
        raise PlanError(f"Step {step!r}: the plan builds the model from its config, and {type(request.model).__name__} has no build().")
    return StepPlan(step, pod, request, vocab_size, _compiled(request.model, request.optimizer, request.trainer,
                                                              request.seq_len, pod, vocab_size))


@functools.lru_cache(maxsize=4)
def _compiled(model: Any, optimizer: Any, trainer: Any, seq_len: int, pod: Pod, vocab_size: int) -> CompiledStep | DoesNotFit:
    """The step these settings compile to, compiled once per process: a change found to fit, planned
    again as a script that applies it (the same settings), is not compiled twice."""
    return compile_train_step(lambda key: model.build(vocab_size, key=key), trainer, optimizer, seq_len=seq_len,
                              devices=pod.devices())


def find_fitting_change(plan: StepPlan, resources: ResourceConfig,
                        on_try: Callable[[dict[str, Any]], None] = lambda settings: None) -> Change | None:
    """The first change (see the module docstring) under which the step compiles, or None when none
    of at most :data:`MAX_CHANGES_TRIED` does. ``on_try`` hears each change before it is planned."""
    request, settings = plan.request, {}
    for _ in range(MAX_CHANGES_TRIED):
        step = _next_change(request, resources)
        if step is None:
            return None
        change, request, resources = step
        settings.update(change)
        on_try(dict(settings))
        tried = plan_step(plan.step, request, resources, plan.vocab_size)
        if tried.fits:
            return Change(dict(settings), tried)
    return None


def _next_change(request: TrainingRequest, resources: ResourceConfig) -> tuple[dict[str, Any], TrainingRequest, ResourceConfig] | None:
    remat = getattr(request.model, "remat", None)
    if remat in REMAT_BY_MEMORY and remat != REMAT_BY_MEMORY[-1]:
        stronger = REMAT_BY_MEMORY[REMAT_BY_MEMORY.index(remat) + 1]
        return {"model.remat": stronger}, dataclasses.replace(request, model=dataclasses.replace(request.model, remat=stronger)), resources
    trainer = request.trainer
    rows = trainer.microbatch_size or trainer.batch_size
    half = rows // 2
    if rows % 2 == 0 and _splits(half, trainer.mesh):
        return {"microbatch_size": half}, dataclasses.replace(request, trainer=dataclasses.replace(trainer, microbatch_size=half)), resources
    bigger = _bigger_slice(resources)
    if bigger is None:
        return None
    # The microbatches as they are, else the whole batch, where the larger mesh cannot split them.
    for microbatch in dict.fromkeys((trainer.microbatch_size, None)):
        try:
            mesh = choose_mesh(bigger, request.model, trainer.batch_size, microbatch_size=microbatch)
        except MeshConfigError:
            continue
        change = {"resources": resource_devices(bigger).resources}
        if microbatch != trainer.microbatch_size:
            change["microbatch_size"] = microbatch
        return change, dataclasses.replace(request, trainer=dataclasses.replace(trainer, mesh=mesh, microbatch_size=microbatch)), bigger
    return None


def _splits(rows: int, mesh: MeshConfig) -> bool:
    parallel = mesh.data * mesh.fsdp * mesh.experts
    return rows >= parallel and rows % parallel == 0


def _bigger_slice(resources: ResourceConfig) -> ResourceConfig | None:
    """The same generation's slice of twice the chips, when there is one."""
    device = resources.device
    tpu = tpu_slice(device.type)
    larger = [size for size in tpu.generation.sizes if size == 2 * tpu.size]
    if not larger:
        return None
    return ResourceConfig.with_tpu(f"{tpu.generation.name}-{larger[0]}", slice_count=device.slice_count)


__all__ = ["Change", "MAX_CHANGES_TRIED", "PlanError", "Pod", "StepPlan", "find_fitting_change", "plan_step", "pod_of"]
