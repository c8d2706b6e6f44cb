"""Accelerator hardware as the cloud publishes it, in one table: for each TPU generation, how a
slice of each size splits into hosts and what one host has, the chips' arrangement (topology) and
the memory (HBM) of one chip; for each GPU model and GPU machine type, how many GPUs, vCPUs and how
much memory a machine has.

This is the only place these figures live. fray reads it to turn ``with_tpu("v5litepod-16")`` into
one replica per host and the chips each host offers Ray; ``infra`` reads it to check a stack's
settings and to write what each node of its Ray cluster declares; the tables in the docs are
checked against it. Each entry names the page of the provider's documentation it comes from.

How the names count. A TPU type is ``<generation>-<N>`` as the TPU API (and Ray's node labels)
write it. For v4 and v5p, N counts TensorCores, two per chip (``v4-8`` is 4 chips); for v5e
(``v5litepod`` to the API) and v6e, N counts chips. ``v5e-N`` is accepted as another spelling of
``v5litepod-N`` and means the same slice.

What a topology is. The chips of a slice sit in a grid, two-dimensional for v5e and v6e (a
v5litepod-256 is 16x16) and three-dimensional for v4 and v5p (a v5p-512's 256 chips are 4x8x8);
``TpuSlice.topology`` writes it as libtpu's topology descriptions do, ``v5e:16x16``, with the short
generation name (``TpuGeneration.chip``). A size comes in several shapes; the table holds the one
the provider lists for it (for v4 and v5p, the most cube-like).

What a host is. Here a host is one TPU VM: one Ray node, one JAX process, one replica of a
multi-host job. Google's v5e and v6e tables also count physical machines of 8 chips, but a slice of
more than 8 chips runs as 4-chip VMs, and the VM is what a program sees: a v5litepod-16 is 4 hosts
of 4 chips.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from fray.errors import FrayError


class UnknownTpuType(FrayError, ValueError):
    """A TPU type that no generation in the table comes in; the message names the accepted forms."""


# -- TPUs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TpuHost:
    """One TPU VM shape: its Compute Engine machine type and what one VM of it has."""

    machine_type: str
    chips: int
    cpus: int
    memory_gb: float


@dataclass(frozen=True)
class TpuGeneration:
    """A TPU generation: how its type names count, the sizes it comes in, and its VM shapes.

    A slice whose chips match one of ``one_host`` runs on a single VM of that shape (v5e and v6e
    offer 1-, 4- and 8-chip VMs); a larger slice runs on as many ``multi_host`` VMs as it needs.
    """

    name: str  # the TPU API's name, which Ray's TPU node labels use too
    aliases: tuple[str, ...]  # other names people write for it
    cores_per_chip: int  # what the number after the dash counts: 2 = TensorCores, 1 = chips
    sizes: tuple[int, ...]  # the numbers after the dash the TPU API accepts
    one_host: tuple[TpuHost, ...]
    multi_host: TpuHost
    source: str  # the provider's page the figures come from
    chip: str  # the chip's short name, as libtpu's topology descriptions write it: "v5e"
    hbm_gib: int  # memory (HBM) of one chip, GiB, as the provider lists it
    topologies: tuple[str, ...]  # the chips' grid for each of ``sizes``, in the same order: "16x16"

    def slice(self, size: int) -> TpuSlice:
        return TpuSlice(self, size)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{size}" for size in self.sizes)


@dataclass(frozen=True)
class TpuSlice:
    """One TPU type, e.g. ``v5litepod-16``: its chips, the VM each host is, and how many hosts."""

    generation: TpuGeneration
    size: int

    def __post_init__(self) -> None:
        if self.size not in self.generation.sizes:
            raise UnknownTpuType(_unknown_tpu_message(f"{self.generation.name}-{self.size}"))

    def __repr__(self) -> str:
        return f"TpuSlice({self.name!r}: {self.hosts} x {self.host.machine_type})"

    @property
    def name(self) -> str:
        """The canonical name, as the TPU API and Ray's ``TPU-<name>-head`` label write it."""
        return f"{self.generation.name}-{self.size}"

    @property
    def chips(self) -> int:
        return self.size // self.generation.cores_per_chip

    @property
    def host(self) -> TpuHost:
        for shape in self.generation.one_host:
            if shape.chips == self.chips:
                return shape
        return self.generation.multi_host

    @property
    def hosts(self) -> int:
        return self.chips // self.host.chips

    @property
    def topology(self) -> str:
        """The chips' arrangement as libtpu names it: ``v5e:16x16``, ``v5p:4x8x8``."""
        shape = self.generation.topologies[self.generation.sizes.index(self.size)]
        return f"{self.generation.chip}:{shape}"

    @property
    def hbm_bytes_per_chip(self) -> int:
        return self.generation.hbm_gib * 2**30


# v4: 4 chips per VM (ct4p-hightpu-4t: 240 vCPUs, 407 GB), v4-8 is one VM; the number counts TensorCores.
# Source: Cloud TPU v4, https://cloud.google.com/tpu/docs/v4 (configurations, VM and host properties),
# and Plan TPUs in GKE, https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus.
_V4_HOST = TpuHost("ct4p-hightpu-4t", chips=4, cpus=240, memory_gb=407)
# v5p: 4 chips per VM (ct5p-hightpu-4t: 208 vCPUs, 448 GB); v5p-16 is 8 chips on 2 hosts.
# Source: Cloud TPU v5p, https://cloud.google.com/tpu/docs/v5p (configurations; VM, host and slice properties).
_V5P_HOST = TpuHost("ct5p-hightpu-4t", chips=4, cpus=208, memory_gb=448)
# v5e: 1-, 4- and 8-chip VMs (ct5lp-hightpu-1t/4t/8t: 24/112/224 vCPUs, 48/192/384 GB); slices of
# more than 8 chips are built from 4-chip VMs. Source: Cloud TPU v5e, https://cloud.google.com/tpu/docs/v5e
# (configurations, VM types), and https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus.
_V5E_HOSTS = (TpuHost("ct5lp-hightpu-1t", chips=1, cpus=24, memory_gb=48),
              TpuHost("ct5lp-hightpu-4t", chips=4, cpus=112, memory_gb=192),
              TpuHost("ct5lp-hightpu-8t", chips=8, cpus=224, memory_gb=384))
# v6e: 1-, 4- and 8-chip VMs (ct6e-standard-1t/4t/8t: 44/180/180 vCPUs, 176/720/1440 GB); v6e-16
# and larger are 4-chip VMs (v6e-16: 4 VMs, v6e-256: 64). Source: Cloud TPU v6e,
# https://cloud.google.com/tpu/docs/v6e (supported configurations, VM types).
_V6E_HOSTS = (TpuHost("ct6e-standard-1t", chips=1, cpus=44, memory_gb=176),
              TpuHost("ct6e-standard-4t", chips=4, cpus=180, memory_gb=720),
              TpuHost("ct6e-standard-8t", chips=8, cpus=180, memory_gb=1440))

# HBM per chip, GiB: v4 32 (https://cloud.google.com/tpu/docs/v4, key specifications), v5p 95 (what
# remains of 96 physical after the system's reserve, https://cloud.google.com/tpu/docs/v5p), v5e 16
# (https://cloud.google.com/tpu/docs/v5e), v6e 32 (https://cloud.google.com/tpu/docs/v6e).
# Topologies: the v5p page's configurations table (2x2x1 for 4 chips ... 16x16x24 for 6,144) and the v4
# page's topologies, AxBxC with A <= B <= C, the most cube-like shape for the chips (the default shape
# of that many chips); the chip counts neither page lists (16 chips: v5p-32; 1,536: v4-3072; 3,072:
# v5p-6144) take that rule's shape. v5e and v6e: their pages' slice shapes (1x1, 2x2, 2x4, 4x4, 4x8,
# 8x8, 8x16, 16x16).
_V4_V5P_TOPOLOGIES = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
                      512: "8x8x8", 768: "8x8x12", 1024: "8x8x16", 1536: "8x12x16", 2048: "8x16x16",
                      3072: "12x16x16", 4096: "16x16x16", 6144: "16x16x24"}
_GRID_TOPOLOGIES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


def _topologies(sizes: tuple[int, ...], cores_per_chip: int, shapes: dict[int, str]) -> tuple[str, ...]:
    return tuple(shapes[size // cores_per_chip] for size in sizes)


_V4_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
_V5P_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288)
_GRID_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)

TPU_GENERATIONS: dict[str, TpuGeneration] = {
    generation.name: generation
    for generation in (
        TpuGeneration("v4", (), cores_per_chip=2, sizes=_V4_SIZES, one_host=(_V4_HOST,), multi_host=_V4_HOST,
                      source="https://cloud.google.com/tpu/docs/v4", chip="v4", hbm_gib=32,
                      topologies=_topologies(_V4_SIZES, 2, _V4_V5P_TOPOLOGIES)),
        TpuGeneration("v5p", (), cores_per_chip=2, sizes=_V5P_SIZES, one_host=(_V5P_HOST,), multi_host=_V5P_HOST,
                      source="https://cloud.google.com/tpu/docs/v5p", chip="v5p", hbm_gib=95,
                      topologies=_topologies(_V5P_SIZES, 2, _V4_V5P_TOPOLOGIES)),
        TpuGeneration("v5litepod", ("v5e",), cores_per_chip=1, sizes=_GRID_SIZES, one_host=_V5E_HOSTS,
                      multi_host=_V5E_HOSTS[1], source="https://cloud.google.com/tpu/docs/v5e", chip="v5e", hbm_gib=16,
                      topologies=_topologies(_GRID_SIZES, 1, _GRID_TOPOLOGIES)),
        TpuGeneration("v6e", (), cores_per_chip=1, sizes=_GRID_SIZES, one_host=_V6E_HOSTS,
                      multi_host=_V6E_HOSTS[1], source="https://cloud.google.com/tpu/docs/v6e", chip="v6e", hbm_gib=32,
                      topologies=_topologies(_GRID_SIZES, 1, _GRID_TOPOLOGIES)),
    )
}
_BY_ANY_NAME = {name: gen for gen in TPU_GENERATIONS.values() for name in (gen.name, *gen.aliases)}

ACCEPTED_TPU_FORMS = ("v4-N and v5p-N, where N counts TensorCores (two per chip: v4-8 is 4 chips); "
                      "v5litepod-N (also written v5e-N) and v6e-N, where N counts chips")


def tpu_slice(tpu_type: str) -> TpuSlice:
    """The slice a TPU type names, in either spelling (``v5e-16`` and ``v5litepod-16`` are one slice).

    Raises :class:`UnknownTpuType`, naming the accepted forms, for anything else.
    """
    written = str(tpu_type).strip().lower()
    generation_name, _, size = written.rpartition("-")
    generation = _BY_ANY_NAME.get(generation_name)
    if generation is None or not size.isdigit() or int(size) not in generation.sizes:
        raise UnknownTpuType(_unknown_tpu_message(str(tpu_type)))
    return TpuSlice(generation, int(size))


def tpu_types() -> list[str]:
    """Every TPU type the table knows, by its canonical name (``v4-8``, ``v5litepod-16``, ...)."""
    return [name for generation in TPU_GENERATIONS.values() for name in generation.types]


def _unknown_tpu_message(tpu_type: str) -> str:
    generation_name, _, size = tpu_type.strip().lower().rpartition("-")
    generation = _BY_ANY_NAME.get(generation_name)
    if generation is not None:
        hint = f" {generation.name} comes in sizes {', '.join(map(str, generation.sizes))}."
        if size.isdigit():  # the sizes on either side of the one asked for
            below = [s for s in generation.sizes if s < int(size)][-1:]
            above = [s for s in generation.sizes if s > int(size)][:1]
            hint += f" Did you mean {' or '.join(repr(f'{generation.name}-{s}') for s in below + above)}?"
    else:
        spellings = tpu_types() + [f"{alias}-{s}" for gen in TPU_GENERATIONS.values() for alias in gen.aliases
                                   for s in gen.sizes]
        hint = _did_you_mean(tpu_type, spellings)
    return (f"Unknown TPU type {tpu_type!r}.{hint} Accepted forms: {ACCEPTED_TPU_FORMS}; "
            "for example 'v4-32' or 'v5litepod-16'.")


# -- GPUs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: the name ``ResourceConfig.with_gpu`` takes (and Ray labels nodes with), its
    Compute Engine accelerator name, and how it comes.

    ``n1_counts`` lists the counts an N1 machine can take, each with the most vCPUs the machine may
    then have; empty for GPUs that only come built into their machine types.
    """

    name: str
    accelerator: str
    n1_counts: tuple[tuple[int, int], ...] = ()


# Source: GPU machine types, https://cloud.google.com/compute/docs/gpus (the accelerator names, and
# the N1 tables for T4 and V100: GPU counts and the most vCPUs for each).
GPU_MODELS: dict[str, GpuModel] = {
    gpu.name: gpu
    for gpu in (
        GpuModel("A100-40G", "nvidia-tesla-a100"),
        GpuModel("A100-80G", "nvidia-a100-80gb"),
        GpuModel("H100", "nvidia-h100-80gb"),
        GpuModel("H200", "nvidia-h200-141gb"),
        GpuModel("B200", "nvidia-b200"),
        GpuModel("L4", "nvidia-l4"),
        GpuModel("T4", "nvidia-tesla-t4", n1_counts=((1, 48), (2, 48), (4, 96))),
        GpuModel("V100", "nvidia-tesla-v100", n1_counts=((1, 12), (2, 24), (4, 48), (8, 96))),
    )
}


@dataclass(frozen=True)
class GpuMachineType:
    """A Compute Engine machine type with GPUs built in: one host, its GPUs, vCPUs and memory."""

    name: str
    gpu: str  # a GPU_MODELS name
    gpus: int
    cpus: int
    memory_gb: float


def _gpu_machine_types() -> list[GpuMachineType]:
    # Source: Accelerator-optimized machine family, https://cloud.google.com/compute/docs/accelerator-optimized-machines
    # (A2 Standard and Ultra, A3 High, Mega and Ultra, A4, G2 tables).
    counts = (1, 2, 4, 8)
    # A2 Standard: 12 vCPUs and 85 GB per A100 40GB (and a 16-GPU machine); A2 Ultra: 12 vCPUs and 170 GB
    # per A100 80GB; A3 High: 26 vCPUs and 234 GB per H100.
    machines = [GpuMachineType(f"a2-highgpu-{n}g", "A100-40G", n, cpus=12 * n, memory_gb=85.0 * n) for n in counts]
    machines.append(GpuMachineType("a2-megagpu-16g", "A100-40G", 16, cpus=96, memory_gb=1360.0))
    machines += [GpuMachineType(f"a2-ultragpu-{n}g", "A100-80G", n, cpus=12 * n, memory_gb=170.0 * n) for n in counts]
    machines += [GpuMachineType(f"a3-highgpu-{n}g", "H100", n, cpus=26 * n, memory_gb=234.0 * n) for n in counts]
    machines += [
        GpuMachineType("a3-megagpu-8g", "H100", 8, cpus=208, memory_gb=1872.0),
        GpuMachineType("a3-ultragpu-8g", "H200", 8, cpus=224, memory_gb=2952.0),
        GpuMachineType("a4-highgpu-8g", "B200", 8, cpus=224, memory_gb=3968.0),
    ]
    # G2: vCPUs -> L4 GPUs, with 4 GB of memory per vCPU.
    for cpus, gpus in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8)):
        machines.append(GpuMachineType(f"g2-standard-{cpus}", "L4", gpus, cpus=cpus, memory_gb=4.0 * cpus))
    return machines


GPU_MACHINE_TYPES: dict[str, GpuMachineType] = {machine.name: machine for machine in _gpu_machine_types()}


def _did_you_mean(written: str, known: list[str]) -> str:
    close = difflib.get_close_matches(written.strip().lower(), known, n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(name) for name in close)}?" if close else ""


__all__ = ["ACCEPTED_TPU_FORMS", "GPU_MACHINE_TYPES", "GPU_MODELS", "TPU_GENERATIONS", "GpuMachineType", "GpuModel",
           "TpuGeneration", "TpuHost", "TpuSlice", "UnknownTpuType", "tpu_slice", "tpu_types"]
