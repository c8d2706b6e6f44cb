"""Which device mesh a training run uses: derived from the resources it runs on, and checked
against its devices, its batch and its model before anything runs.

The mesh is placement, not identity: it decides where each array lives and which devices add up
which sums, never what a run computes, so a step's hash leaves it out (as it leaves out the
resources it comes from). :func:`choose_mesh` is a plain function of its arguments; nothing here
asks JAX for a device, so a planner can call it for a pod it does not have.

What the resources give by default (:func:`default_mesh`):

* ``with_tpu(type, slice_count)``: every chip of a slice (hosts x chips per host) on ``fsdp``, and
  the slices on ``data``. Inside a slice the chips share the fast inter-chip links that fsdp's
  per-layer gathers need; between slices there is only the data-centre network, which data
  parallelism crosses once a step (one all-reduce of the gradients).
* ``with_gpu(variant, n)``: the n GPUs of each replica (a node) on ``fsdp``, the replicas on ``data``.
* the CPU: one device per process (``data = replicas``). XLA's simulated CPU devices share the
  same cores, so a CPU run spread over them only adds collectives; an explicit mesh still may.

A mesh is refused (:class:`~levanter.trainer.config.MeshConfigError`, one line naming the numbers)
when its sizes do not multiply to the devices the resources have (CPU resources fix no count of
devices: there the sizes need only spread evenly over the processes), when a (micro)batch does
not split into whole rows over ``data x fsdp x experts``, when ``model`` does not divide the
model's query and key/value heads, or when ``experts`` does not divide its experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fray.cluster import ResourceConfig
from fray.cluster.resources import GpuDevice, TpuDevice

from levanter.trainer.config import BATCH_AXES, MeshConfig, MeshConfigError


@dataclass(frozen=True)
class ResourceDevices:
    """The devices a step's resources give: how many (None where the resources do not fix it, as on
    the CPU), over how many processes (one per replica), and the resources as a script writes them."""

    count: int | None
    processes: int
    resources: str  # "with_tpu('v5litepod-256')"
    layout: str = ""  # "64 hosts x 4 chips"

    def __str__(self) -> str:
        return f"{self.resources} ({self.layout})" if self.layout else self.resources


def resource_devices(resources: ResourceConfig) -> ResourceDevices:
    """The devices ``resources`` give every process of a step together."""
    device, replicas = resources.device, resources.replicas
    if isinstance(device, TpuDevice):
        slices = f", slice_count={device.slice_count}" if device.slice_count > 1 else ""
        hosts = device.hosts_per_slice
        layout = f"{hosts} host{'s' if hosts > 1 else ''} x {device.chips_per_host} chips"
        if device.slice_count > 1:
            layout = f"{device.slice_count} slices x {layout}"
        return ResourceDevices(device.chips_per_slice * device.slice_count, replicas,
                               f"with_tpu({device.type!r}{slices})", layout)
    if isinstance(device, GpuDevice):
        nodes = f", replicas={replicas}" if replicas > 1 else ""
        return ResourceDevices(device.count * replicas, replicas, f"with_gpu({device.variant!r}, {device.count}{nodes})",
                               f"{replicas} replicas x {device.count} GPUs" if replicas > 1 else "")
    return ResourceDevices(None, replicas, f"with_cpu(replicas={replicas})" if replicas > 1 else "with_cpu()")


def default_mesh(resources: ResourceConfig) -> MeshConfig:
    """The mesh ``resources`` give when a step names none (see the module's docstring)."""
    device = resources.device
    if isinstance(device, TpuDevice):
        return MeshConfig(data=device.slice_count, fsdp=device.chips_per_slice)
    if isinstance(device, GpuDevice):
        return MeshConfig(data=resources.replicas, fsdp=device.count)
    return MeshConfig(data=resources.replicas)


def choose_mesh(
    resources: ResourceConfig | None,
    model: Any,
    batch_size: int,
    *,
    microbatch_size: int | None = None,
    mesh: MeshConfig | None = None,
) -> MeshConfig:
    """``mesh``, or the mesh ``resources`` give by default, checked against them, the batch and ``model``.

    Returns the mesh with its -1 axis resolved where the resources fix the number of devices.
    ``model`` is any model config; its ``num_heads``, ``num_kv_heads`` and ``num_experts`` are
    checked when it has them. Raises :class:`MeshConfigError` (see the module's docstring).
    """
    resources = resources if resources is not None else ResourceConfig.with_cpu()
    if mesh is not None and not isinstance(mesh, MeshConfig):
        raise MeshConfigError(f"mesh must be a MeshConfig(data=..., fsdp=..., model=..., experts=...), got {type(mesh).__name__}.")
    devices = resource_devices(resources)
    # How messages name the mesh: the one the step gave, or the one its resources chose.
    origin = "the mesh" if mesh is not None else f"the mesh chosen for {devices.resources}"
    mesh = _fit_devices(mesh if mesh is not None else default_mesh(resources), devices)
    origin = f"{origin} ({mesh.describe()})"
    _check_batch(mesh, batch_size, microbatch_size, origin)
    _check_model(mesh, model, origin)
    return mesh


def _fit_devices(mesh: MeshConfig, devices: ResourceDevices) -> MeshConfig:
    sizes = mesh.sizes()
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if devices.count is None:
        if -1 not in sizes.values() and fixed % devices.processes:
            raise MeshConfigError(
                f"Mesh {mesh.describe()} has {fixed} devices, which do not spread evenly over the {devices.processes} "
                f"processes of {devices}; make it a multiple of {devices.processes}."
            )
        return mesh
    if -1 in sizes.values():
        if devices.count % fixed:
            raise MeshConfigError(
                f"Mesh {mesh.describe()}: {devices} has {devices.count} devices, which the other axes' {fixed} do not "
                f"divide; make their product divide {devices.count}."
            )
        free = next(axis for axis, size in sizes.items() if size == -1)
        return MeshConfig(**{**sizes, free: devices.count // fixed})
    if fixed != devices.count:
        raise MeshConfigError(
            f"Mesh {mesh.describe()} has {fixed} devices, but {devices} has {devices.count}; make the sizes multiply "
            f"to {devices.count}, or give one axis -1 to take the rest."
        )
    return mesh


def _check_batch(mesh: MeshConfig, batch_size: int, microbatch_size: int | None, origin: str) -> None:
    sizes = mesh.sizes()
    if any(sizes[axis] == -1 for axis in BATCH_AXES):
        return  # the devices decide it when the run starts; the trainer checks it then
    parallel = math.prod(sizes[axis] for axis in BATCH_AXES)
    label, rows = ("microbatch_size", microbatch_size) if microbatch_size is not None else ("batch_size", batch_size)
    if rows % parallel:
        raise MeshConfigError(
            f"{label}={rows} does not split into whole rows over the data x fsdp x experts = {parallel} devices of "
            f"{origin}; use a {label} that is a multiple of {parallel}, or a mesh=MeshConfig(...) whose "
            f"data x fsdp x experts divides {rows} (the rest of the devices on model)."
        )


def _check_model(mesh: MeshConfig, model: Any, origin: str) -> None:
    counts = [(name, getattr(model, name, None)) for name in ("num_heads", "num_kv_heads")]
    counts = [(name, count) for name, count in counts if isinstance(count, int) and count > 0]
    for name, count in counts:
        if count % mesh.model:
            choices = _divisors(math.gcd(*(c for _, c in counts)))
            raise MeshConfigError(
                f"model={mesh.model} of {origin} does not divide the model's {name}={count} (tensor parallelism "
                f"gives each device whole heads); choose model from {', '.join(map(str, choices))}."
            )
    experts = getattr(model, "num_experts", None)
    if isinstance(experts, int) and experts > 0 and experts % mesh.experts:
        raise MeshConfigError(
            f"experts={mesh.experts} of {origin} does not divide the model's num_experts={experts} (expert "
            f"parallelism gives each device whole experts); choose experts from {', '.join(map(str, _divisors(experts)))}."
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


__all__ = ["ResourceDevices", "choose_mesh", "default_mesh", "resource_devices"]
