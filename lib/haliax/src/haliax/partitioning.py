"""Placing arrays on a device mesh by their logical axis names.

A mesh has four named axes: ``data`` (pure data parallelism: parameters replicated), ``fsdp``
(data parallelism with parameters and optimizer state sharded), ``experts`` (data parallelism
whose devices each hold a share of every MoE layer's experts: expert parallelism) and ``model``
(tensor parallelism). ``AxisRules`` maps each logical axis (``embed``, ``mlp``, ...) to mesh axes;
the same model code then runs on one CPU or on a pod slice, and only the mesh changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from haliax.axes import Axes
from haliax.errors import HaliaxError
from haliax.module import logical_axes

logger = logging.getLogger(__name__)

# experts sits beside model: its all-to-all is the heaviest traffic after tensor parallelism's.
MESH_AXES = ("data", "fsdp", "experts", "model")

MeshAxes = str | tuple[str, ...] | None

DEFAULT_RULES: dict[str, MeshAxes] = {
    "batch": ("data", "fsdp", "experts"),
    "embed": "fsdp",
    "mlp": "model",
    "heads": "model",
    "kv_heads": "model",
    "vocab": "model",
    "head_dim": None,
    "layers": None,
    "experts": "experts",
    "seq": None,
}


class PartitioningError(HaliaxError, ValueError):
    """A mesh or axis mapping that cannot be built as asked."""


@dataclass(frozen=True)
class AxisRules:
    """Logical axis name -> mesh axis (or tuple of mesh axes, or ``None`` for replicated).

    Names not in the mapping are replicated. ``AxisRules.default().with_overrides(embed=None)``
    derives a variant.
    """

    mapping: Mapping[str, MeshAxes] = field(default_factory=lambda: dict(DEFAULT_RULES))

    @classmethod
    def default(cls) -> "AxisRules":
        return cls(dict(DEFAULT_RULES))

    def with_overrides(self, **overrides: MeshAxes) -> "AxisRules":
        return AxisRules({**self.mapping, **overrides})

    def mesh_axes_for(self, name: str | None) -> MeshAxes:
        return None if name is None else self.mapping.get(name)


def make_mesh(
    data: int = -1, fsdp: int = 1, model: int = 1, experts: int = 1, *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A ``Mesh`` with axes ``(data, fsdp, experts, model)``; one size may be -1 to take the remaining devices."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = [data, fsdp, experts, model]
    described = f"data={data}, fsdp={fsdp}, experts={experts}, model={model}"
    if sizes.count(-1) > 1:
        raise PartitioningError(f"At most one mesh axis may be -1, got {described}.")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise PartitioningError(
                f"{len(devices)} devices cannot be split into data*fsdp*experts*model with fixed part {known}."
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise PartitioningError(
            f"Mesh data={sizes[0]} x fsdp={sizes[1]} x experts={sizes[2]} x model={sizes[3]} needs "
            f"{int(np.prod(sizes))} devices, but {len(devices)} are available. Pass -1 for one axis to use all devices."
        )
    return Mesh(device_grid(devices, sizes), MESH_AXES)


def device_grid(devices: Sequence[jax.Device], sizes: Sequence[int]) -> np.ndarray:
    """``devices`` laid out in an array of shape ``sizes`` (the mesh axes in :data:`MESH_AXES` order).

    On TPUs, JAX's ``mesh_utils`` chooses the layout: neighbours in the chips' physical torus sit
    next to each other along every mesh axis, and when the devices span several slices, the
    slices split the outermost (``data``) axis, so that only data parallelism crosses the
    data-centre network between slices. Elsewhere (CPU, GPU) the devices keep the order given.
    """
    devices = list(devices)
    if devices[0].platform != "tpu":
        return np.array(devices).reshape(sizes)
    from jax.experimental import mesh_utils

    slices = len({getattr(device, "slice_index", 0) for device in devices})
    if slices > 1:
        if sizes[0] % slices:
            raise PartitioningError(
                f"The devices span {slices} TPU slices, which must split the data axis (data={sizes[0]}) so that "
                f"only data parallelism crosses the network between them; make data a multiple of {slices}."
            )
        within = [sizes[0] // slices, *sizes[1:]]
        across = [slices] + [1] * (len(sizes) - 1)
        return mesh_utils.create_hybrid_device_mesh(within, across, devices, allow_split_physical_axes=True)
    return mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)


def partition_spec(axes: Axes | Sequence[str | None], shape: Sequence[int] | None, mesh: Mesh, rules: AxisRules) -> PartitionSpec:
    """The ``PartitionSpec`` for one array.

    A mesh axis is dropped (that dimension replicated instead) when it is already used by an
    earlier dimension of the same array or when it does not divide the dimension: both would
    make an invalid sharding, and replication is always correct. Size-1 mesh axes are omitted.
    """
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(axes):
        target = rules.mesh_axes_for(name)
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        kept = []
        divisor = 1
        for mesh_axis in targets:
            size = mesh.shape.get(mesh_axis, 1)
            if mesh_axis in used or mesh_axis not in mesh.shape or size == 1:
                continue  # size-1 axes split nothing; leaving them out keeps specs readable
            if shape is not None and shape[dim] % (divisor * size):
                logger.debug("Replicating %s (size %d) instead of splitting it %d ways.", name, shape[dim], size)
                continue
            kept.append(mesh_axis)
            divisor *= size
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def _is_axes(x: Any) -> bool:
    return isinstance(x, Axes)


def shardings_for(tree: Any, mesh: Mesh, rules: AxisRules | None = None) -> Any:
    """A pytree of ``NamedSharding`` pairing one-to-one with the arrays of ``tree``."""
    rules = rules or AxisRules.default()
    axes_tree = logical_axes(tree)
    return jax.tree.map(
        lambda axes, array: NamedSharding(mesh, partition_spec(axes, array.shape, mesh, rules)),
        axes_tree,
        tree,
        is_leaf=_is_axes,
    )


def shard(tree: Any, mesh: Mesh, rules: AxisRules | None = None) -> Any:
    """``tree`` with every array placed (``device_put``) according to its logical axes."""
    return jax.device_put(tree, shardings_for(tree, mesh, rules))


_ACTIVE: contextvars.ContextVar[tuple[Mesh, AxisRules] | None] = contextvars.ContextVar("haliax_mesh", default=None)


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: AxisRules | None = None) -> Iterator[Mesh]:
    """Make ``mesh`` and ``rules`` the ones ``constrain`` uses while tracing inside this block."""
    token = _ACTIVE.set((mesh, rules or AxisRules.default()))
    try:
        yield mesh
    finally:
        _ACTIVE.reset(token)


def current_mesh() -> tuple[Mesh, AxisRules] | None:
    return _ACTIVE.get()


def constrain(x: jax.Array, axes: Axes | Sequence[str | None]) -> jax.Array:
    """Ask the compiler to lay activation ``x`` out by its logical ``axes``.

    A no-op outside ``use_mesh`` (single-device code pays nothing), so models can call it freely.
    """
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    if len(tuple(axes)) != x.ndim:
        raise PartitioningError(f"constrain: {x.ndim}-d array given {len(tuple(axes))} axis names {tuple(axes)}.")
    spec = partition_spec(axes, x.shape, mesh, rules)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
