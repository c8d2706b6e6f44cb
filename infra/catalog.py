"""What Google Cloud offers, as far as a stack's settings are checked against it: machine types
(vCPUs, memory, attached GPUs), which GPUs an N1 machine can take and how many, and the TPU
accelerator types with the software each runs.

The tables hold the machine families a Marin cluster uses (general purpose N1, N2, E2 for heads
and CPU workers; the accelerator-optimized A2, A3, A4 and G2; N1 with T4 or V100 attached). A
machine type outside them is refused with the closest names rather than passed on to fail at
``ray up`` time. GPU names are the ones ``ResourceConfig.with_gpu`` takes (and Ray labels nodes
with); TPU names are the accelerator types of the TPU API, which Ray's TPU labels also use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MachineType:
    """One Compute Engine machine type: its vCPUs and memory, and the GPUs built into it."""

    name: str
    cpus: int
    memory_gb: float
    gpu_type: str | None = None
    gpu_count: int = 0


@dataclass(frozen=True)
class GpuType:
    """A GPU model: its Compute Engine accelerator name, and how it is attached.

    ``n1_counts`` lists the counts an N1 machine can take, with the most vCPUs the machine may
    have for each count; empty for GPUs that only come built into their machine types.
    """

    name: str
    accelerator: str
    n1_counts: tuple[tuple[int, int], ...] = ()


GPU_TYPES: dict[str, GpuType] = {
    gpu.name: gpu
    for gpu in (
        GpuType("A100-40G", "nvidia-tesla-a100"),
        GpuType("A100-80G", "nvidia-a100-80gb"),
        GpuType("H100", "nvidia-h100-80gb"),
        GpuType("H200", "nvidia-h200-141gb"),
        GpuType("B200", "nvidia-b200"),
        GpuType("L4", "nvidia-l4"),
        GpuType("T4", "nvidia-tesla-t4", n1_counts=((1, 48), (2, 48), (4, 96))),
        GpuType("V100", "nvidia-tesla-v100", n1_counts=((1, 12), (2, 24), (4, 48), (8, 96))),
    )
}

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
    machines = []
    for n in (1, 2, 4, 8):
        machines.append(MachineType(f"a2-highgpu-{n}g", 12 * n, 85.0 * n, "A100-40G", n))
        machines.append(MachineType(f"a2-ultragpu-{n}g", 12 * n, 170.0 * n, "A100-80G", n))
        machines.append(MachineType(f"a3-highgpu-{n}g", 26 * n, 234.0 * n, "H100", n))
    machines += [
        MachineType("a2-megagpu-16g", 96, 1360.0, "A100-40G", 16),
        MachineType("a3-megagpu-8g", 208, 1872.0, "H100", 8),
        MachineType("a3-ultragpu-8g", 224, 2952.0, "H200", 8),
        MachineType("a4-highgpu-8g", 224, 3968.0, "B200", 8),
    ]
    # G2: vCPUs -> attached L4 GPUs (4 GB of memory per vCPU).
    for cpus, gpus in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8)):
        machines.append(MachineType(f"g2-standard-{cpus}", cpus, 4.0 * cpus, "L4", gpus))
    return machines


MACHINE_TYPES: dict[str, MachineType] = {m.name: m for m in _general_purpose() + _accelerator_optimized()}


@dataclass(frozen=True)
class TpuGeneration:
    """A TPU generation as the TPU API names it: the sizes its accelerator types come in (the
    number after the dash: TensorCores for v4/v5p, chips for v5e/v6e), its default VM software,
    and one full host: its chips, vCPUs and memory."""

    name: str
    sizes: tuple[int, ...]
    runtime_version: str
    cores_per_chip: int
    chips_per_host: int
    host_cpus: int
    host_memory_gb: float

    def chips(self, size: int) -> int:
        return max(1, size // self.cores_per_chip)

    def chips_on_host(self, size: int) -> int:
        """Chips each host of a slice of ``size`` has (a slice smaller than a host has them all on one)."""
        return min(self.chips(size), self.chips_per_host)

    def hosts(self, size: int) -> int:
        return max(1, self.chips(size) // self.chips_per_host)


TPU_GENERATIONS: dict[str, TpuGeneration] = {
    gen.name: gen
    for gen in (
        TpuGeneration("v4", (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096), "tpu-ubuntu2204-base",
                      cores_per_chip=2, chips_per_host=4, host_cpus=240, host_memory_gb=407),
        TpuGeneration("v5p", (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288), "v2-alpha-tpuv5",
                      cores_per_chip=2, chips_per_host=4, host_cpus=208, host_memory_gb=448),
        TpuGeneration("v5litepod", (1, 4, 8, 16, 32, 64, 128, 256), "v2-alpha-tpuv5-lite",
                      cores_per_chip=1, chips_per_host=8, host_cpus=224, host_memory_gb=384),
        TpuGeneration("v6e", (1, 4, 8, 16, 32, 64, 128, 256), "v2-alpha-tpuv6e",
                      cores_per_chip=1, chips_per_host=8, host_cpus=180, host_memory_gb=1440),
    )
}

# Names people write for a generation that the TPU API spells otherwise.
TPU_ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod"}


def tpu_types() -> list[str]:
    """Every TPU accelerator type the catalog knows, e.g. ``v4-8``, ``v5litepod-16``."""
    return [f"{gen.name}-{size}" for gen in TPU_GENERATIONS.values() for size in gen.sizes]


def tpu_generation(tpu_type: str) -> TpuGeneration | None:
    """The generation of a known accelerator type such as ``v6e-8``, else ``None``."""
    name, _, size = tpu_type.rpartition("-")
    gen = TPU_GENERATIONS.get(name)
    if gen is None or not size.isdigit() or int(size) not in gen.sizes:
        return None
    return gen


__all__ = ["GPU_FAMILY_LABELS", "GPU_TYPES", "MACHINE_TYPES", "TPU_ALIASES", "TPU_GENERATIONS", "GpuType",
           "MachineType", "TpuGeneration", "tpu_generation", "tpu_types"]
