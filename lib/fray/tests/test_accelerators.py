"""The accelerator table holds the providers' published figures, and fray's placement follows it:
replicas (hosts per slice), chips per host and host vCPUs for each TPU type, GPUs and vCPUs for
each GPU machine type. The expected numbers below are typed from Google's pages, not derived from
the table, so a wrong entry fails here."""

import pytest

from fray.cluster import InvalidResourceConfig, ResourceConfig
from fray.cluster.accelerators import (
    GPU_MACHINE_TYPES,
    GPU_MODELS,
    TPU_GENERATIONS,
    UnknownTpuType,
    tpu_slice,
    tpu_types,
)
from fray.cluster.ray_client import ray_options

# (type as a user writes it, hosts per slice, chips per host, vCPUs per host), from
# https://cloud.google.com/tpu/docs/v4, /v5p, /v5e and /v6e (configurations and VM types).
PUBLISHED_TPU_SHAPES = [
    ("v4-8", 1, 4, 240),
    ("v4-16", 2, 4, 240),
    ("v4-32", 4, 4, 240),
    ("v4-128", 16, 4, 240),
    ("v4-4096", 512, 4, 240),
    ("v5p-8", 1, 4, 208),
    ("v5p-16", 2, 4, 208),
    ("v5p-128", 16, 4, 208),
    ("v5p-12288", 1536, 4, 208),
    ("v5litepod-1", 1, 1, 24),
    ("v5litepod-4", 1, 4, 112),
    ("v5litepod-8", 1, 8, 224),
    ("v5litepod-16", 4, 4, 112),
    ("v5e-16", 4, 4, 112),
    ("v5e-32", 8, 4, 112),
    ("v5litepod-256", 64, 4, 112),
    ("v6e-1", 1, 1, 44),
    ("v6e-4", 1, 4, 180),
    ("v6e-8", 1, 8, 180),
    ("v6e-16", 4, 4, 180),
    ("v6e-64", 16, 4, 180),
    ("v6e-256", 64, 4, 180),
]

# (machine type, GPU model, GPUs, vCPUs), from https://cloud.google.com/compute/docs/accelerator-optimized-machines.
PUBLISHED_GPU_MACHINES = [
    ("a2-highgpu-1g", "A100-40G", 1, 12), ("a2-highgpu-2g", "A100-40G", 2, 24),
    ("a2-highgpu-4g", "A100-40G", 4, 48), ("a2-highgpu-8g", "A100-40G", 8, 96),
    ("a2-megagpu-16g", "A100-40G", 16, 96),
    ("a2-ultragpu-1g", "A100-80G", 1, 12), ("a2-ultragpu-2g", "A100-80G", 2, 24),
    ("a2-ultragpu-4g", "A100-80G", 4, 48), ("a2-ultragpu-8g", "A100-80G", 8, 96),
    ("a3-highgpu-1g", "H100", 1, 26), ("a3-highgpu-2g", "H100", 2, 52),
    ("a3-highgpu-4g", "H100", 4, 104), ("a3-highgpu-8g", "H100", 8, 208),
    ("a3-megagpu-8g", "H100", 8, 208), ("a3-ultragpu-8g", "H200", 8, 224), ("a4-highgpu-8g", "B200", 8, 224),
    ("g2-standard-4", "L4", 1, 4), ("g2-standard-8", "L4", 1, 8), ("g2-standard-12", "L4", 1, 12),
    ("g2-standard-16", "L4", 1, 16), ("g2-standard-24", "L4", 2, 24), ("g2-standard-32", "L4", 1, 32),
    ("g2-standard-48", "L4", 4, 48), ("g2-standard-96", "L4", 8, 96),
]


@pytest.mark.parametrize("tpu_type, hosts, chips_per_host, host_cpus", PUBLISHED_TPU_SHAPES,
                         ids=[shape[0] for shape in PUBLISHED_TPU_SHAPES])
def test_each_tpu_type_runs_one_replica_per_published_host(tpu_type, hosts, chips_per_host, host_cpus):
    resources = ResourceConfig.with_tpu(tpu_type)
    assert resources.replicas == hosts
    assert ray_options(resources)["resources"]["TPU"] == chips_per_host
    assert resources.device.slice.host.cpus == host_cpus
    assert resources.device.chips_per_slice == hosts * chips_per_host


def test_every_generation_the_project_names_is_covered_by_the_published_shapes():
    covered = {tpu_slice(tpu_type).generation.name for tpu_type, *_ in PUBLISHED_TPU_SHAPES}
    assert covered == set(TPU_GENERATIONS) == {"v4", "v5p", "v5litepod", "v6e"}


@pytest.mark.parametrize("tpu_type", tpu_types())
def test_every_size_fills_whole_hosts(tpu_type):
    tpu = tpu_slice(tpu_type)
    assert tpu.hosts >= 1 and tpu.hosts * tpu.host.chips == tpu.chips


def test_v4_and_v5p_count_tensor_cores_and_v5e_and_v6e_count_chips():
    assert [tpu_slice(name).chips for name in ("v4-8", "v5p-8", "v5litepod-8", "v6e-8")] == [4, 4, 8, 8]


def test_v5e_spellings_name_one_slice_in_the_tpu_apis_name():
    assert tpu_slice("v5e-16") == tpu_slice("v5litepod-16") == tpu_slice(" V5E-16 ")
    assert tpu_slice("v5e-16").name == "v5litepod-16"


@pytest.mark.parametrize("written, words", [
    ("v9-8", "Did you mean 'v4-8'"),
    ("v4-12", "Did you mean 'v4-8' or 'v4-16'?"),
    ("v5e-12", "Did you mean 'v5litepod-8' or 'v5litepod-16'?"),
    ("v6e", "Unknown TPU type 'v6e'"),
])
def test_an_unknown_tpu_type_is_refused_naming_the_accepted_forms(written, words):
    with pytest.raises(UnknownTpuType) as error:
        tpu_slice(written)
    assert words in str(error.value)
    assert "v5litepod-N (also written v5e-N)" in str(error.value)
    with pytest.raises(InvalidResourceConfig, match="Accepted forms"):  # the same words from ResourceConfig
        ResourceConfig.with_tpu(written)


@pytest.mark.parametrize("name, model, gpus, cpus", PUBLISHED_GPU_MACHINES, ids=[m[0] for m in PUBLISHED_GPU_MACHINES])
def test_each_gpu_machine_type_has_its_published_gpus_and_vcpus(name, model, gpus, cpus):
    machine = GPU_MACHINE_TYPES[name]
    assert (machine.gpu, machine.gpus, machine.cpus) == (model, gpus, cpus)
    assert machine.gpu in GPU_MODELS
    # A request for the whole machine asks Ray for exactly its GPUs, of its model.
    options = ray_options(ResourceConfig.with_gpu(model, gpus, cpu=cpus))
    assert (options["num_gpus"], options["accelerator_type"], options["num_cpus"]) == (gpus, model, cpus)


def test_the_published_gpu_machines_are_every_gpu_machine_in_the_table():
    assert {name for name, *_ in PUBLISHED_GPU_MACHINES} == set(GPU_MACHINE_TYPES)
