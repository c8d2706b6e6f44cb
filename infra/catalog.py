"""What Google Cloud offers, as far as a stack's settings are checked against it: machine types
(vCPUs, memory, attached GPUs), which GPUs an N1 machine can take and how many, and the TPU
accelerator types with the software each runs.

The accelerator figures (GPU models and machine types, TPU generations with their hosts) are
fray's one table, :mod:`fray.cluster.accelerators`, so the cluster file declares what fray asks
for; this module adds the general-purpose machines a Marin cluster uses for heads and CPU workers
(N1, N2, E2) and each TPU generation's VM software. A machine type outside the tables is refused
with the closest names rather than passed on to fail at ``ray up`` time. GPU names are the ones
``ResourceConfig.with_gpu`` takes (and Ray labels nodes with); TPU names are the accelerator types
of the TPU API, which Ray's TPU labels also use (``v5e-N`` is read as ``v5litepod-N``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fray.cluster.accelerators import GPU_MACHINE_TYPES, GPU_MODELS, GpuModel


@dataclass(frozen=True)
class MachineType:
    """One Compute Engine machine type: its vCPUs and memory, and the GPUs built into it."""

    name: str
    cpus: int
    memory_gb: float
    gpu_type: str | None = None
    gpu_count: int = 0


# The GPU models a worker group may name, by the name ResourceConfig.with_gpu takes.
GPU_TYPES: dict[str, GpuModel] = GPU_MODELS

# Ray labels a node with one accelerator type; a request written with the family name ("A100")
# should still land on either A100 model, so those nodes declare the family label as well.
GPU_FAMILY_LABELS = {"A100-40G": ("A100",), "A100-80G": ("A100",)}


def _general_purpose() -> list[MachineType]:
    # Memory per vCPU of each family (GB), and the sizes it comes in.
    families = {
        "n1-standard": (3.75, (1, 2, 4, 8, 16, 32, 64, 96)),
        "n1-highmem": (6.5, (2, 4, 8, 16, 32, 64, 96)),
        "n1-highcpu": (0.9, (2, 4, 8, 16, 32, 64, 96)),
        "n2-standard": (4.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        "n2-highmem": (8.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        "n2-highcpu": (1.0, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
        "e2-standard": (4.0, (2, 4, 8, 16, 32)),
        "e2-highmem": (8.0, (2, 4, 8, 16)),
    }
    return [MachineType(f"{family}-{n}", n, ratio * n) for family, (ratio, sizes) in families.items() for n in sizes]


def _accelerator_optimized() -> list[MachineType]:
    return [MachineType(m.name, m.cpus, m.memory_gb, m.gpu, m.gpus) for m in GPU_MACHINE_TYPES.values()]


MACHINE_TYPES: dict[str, MachineType] = {m.name: m for m in _general_purpose() + _accelerator_optimized()}

# The VM software a TPU slice of each generation boots by default (the TPU API's runtime versions);
# a worker group's tpu_runtime_version overrides it.
TPU_RUNTIME_VERSIONS = {
    "v4": "tpu-ubuntu2204-base",
    "v5p": "v2-alpha-tpuv5",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}


__all__ = ["GPU_FAMILY_LABELS", "GPU_TYPES", "MACHINE_TYPES", "TPU_RUNTIME_VERSIONS", "MachineType"]
