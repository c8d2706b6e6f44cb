"""The device mesh a run gets from its resources, and the meshes refused before anything runs."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from fray.cluster import ResourceConfig
from levanter.models.llama import LlamaConfig
from levanter.models.moe import MoeConfig
from levanter.trainer import MeshConfig
from levanter.trainer.config import MeshConfigError
from levanter.trainer.mesh_choice import choose_mesh, default_mesh, resource_devices
from levanter.trainer.trainer import mesh_devices

# llama_8b's attention: 32 query heads, 8 key/value heads.
LLAMA_8B_HEADS = LlamaConfig(hidden_dim=4096, intermediate_dim=14336, num_layers=32, num_heads=32, num_kv_heads=8)
MOE = MoeConfig(hidden_dim=64, intermediate_dim=128, num_layers=2, num_heads=4, num_kv_heads=4, num_experts=8)


@pytest.mark.parametrize(
    "resources, expected",
    [
        # Every chip of one slice on fsdp: v5e counts chips (64 hosts x 4), v5p and v4 count TensorCores, two per chip.
        (ResourceConfig.with_tpu("v5litepod-256"), MeshConfig(data=1, fsdp=256)),
        (ResourceConfig.with_tpu("v5e-16"), MeshConfig(data=1, fsdp=16)),
        (ResourceConfig.with_tpu("v5p-512"), MeshConfig(data=1, fsdp=256)),
        (ResourceConfig.with_tpu("v4-32"), MeshConfig(data=1, fsdp=16)),
        # Several slices: data across them.
        (ResourceConfig.with_tpu("v5litepod-256", slice_count=2), MeshConfig(data=2, fsdp=256)),
        # GPUs alike: a node's GPUs on fsdp, the nodes on data.
        (ResourceConfig.with_gpu("H100", 8), MeshConfig(data=1, fsdp=8)),
        (ResourceConfig.with_gpu("H100", 8, replicas=4), MeshConfig(data=4, fsdp=8)),
        # The CPU: one device (per process).
        (ResourceConfig.with_cpu(), MeshConfig(data=1, fsdp=1)),
        (ResourceConfig.with_cpu(replicas=4), MeshConfig(data=4, fsdp=1)),
    ],
)
def test_the_resources_choose_the_mesh(resources, expected):
    assert default_mesh(resources) == expected
    assert choose_mesh(resources, LLAMA_8B_HEADS, batch_size=1024) == expected


def test_a_slice_counts_its_hosts_and_chips_and_the_cpu_counts_none():
    assert resource_devices(ResourceConfig.with_tpu("v5litepod-256")).count == 256
    assert resource_devices(ResourceConfig.with_tpu("v5litepod-256")).processes == 64
    assert str(resource_devices(ResourceConfig.with_tpu("v5litepod-256", 2))) == \
        "with_tpu('v5litepod-256', slice_count=2) (2 slices x 64 hosts x 4 chips)"
    assert resource_devices(ResourceConfig.with_gpu("H100", 8, replicas=2)).count == 16
    assert resource_devices(ResourceConfig.with_cpu(replicas=4)).count is None


def test_a_named_mesh_is_kept_and_its_free_axis_takes_the_rest_of_the_chips():
    v5e_256 = ResourceConfig.with_tpu("v5litepod-256")
    assert choose_mesh(v5e_256, LLAMA_8B_HEADS, 256, mesh=MeshConfig(data=1, fsdp=32, model=8)) == \
        MeshConfig(data=1, fsdp=32, model=8)
    assert choose_mesh(v5e_256, LLAMA_8B_HEADS, 256, mesh=MeshConfig(fsdp=64, model=2)) == MeshConfig(data=2, fsdp=64, model=2)
    # On the CPU the resources fix no number of devices: the -1 is left to the run, and simulated devices may be named.
    assert choose_mesh(ResourceConfig.with_cpu(), LLAMA_8B_HEADS, 8, mesh=MeshConfig(data=1, fsdp=8)) == MeshConfig(data=1, fsdp=8)
    assert choose_mesh(None, LLAMA_8B_HEADS, 8, mesh=MeshConfig()) == MeshConfig(data=-1)


V5E_256 = ResourceConfig.with_tpu("v5litepod-256")


@pytest.mark.parametrize(
    "resources, model, batch, options, message",
    [
        (V5E_256, LLAMA_8B_HEADS, 256, {"mesh": MeshConfig(fsdp=128, data=1)},
         "Mesh data=1 x fsdp=128 x experts=1 x model=1 has 128 devices, but with_tpu('v5litepod-256') "
         "(64 hosts x 4 chips) has 256; make the sizes multiply to 256, or give one axis -1 to take the rest."),
        (V5E_256, LLAMA_8B_HEADS, 256, {"mesh": MeshConfig(data=1, fsdp=-1, model=3)},
         "with_tpu('v5litepod-256') (64 hosts x 4 chips) has 256 devices, which the other axes' 3 do not divide"),
        # The tutorial's batch of 4 on the mesh a v5e-256 chooses.
        (V5E_256, LLAMA_8B_HEADS, 4, {},
         "batch_size=4 does not split into whole rows over the data x fsdp x experts = 256 devices of the mesh chosen "
         "for with_tpu('v5litepod-256') (data=1 x fsdp=256 x experts=1 x model=1); use a batch_size that is a "
         "multiple of 256"),
        (V5E_256, LLAMA_8B_HEADS, 512, {"microbatch_size": 64},
         "microbatch_size=64 does not split into whole rows over the data x fsdp x experts = 256 devices"),
        (V5E_256, LLAMA_8B_HEADS, 256, {"mesh": MeshConfig(data=1, fsdp=16, model=16)},
         "model=16 of the mesh (data=1 x fsdp=16 x experts=1 x model=16) does not divide the model's num_kv_heads=8 "
         "(tensor parallelism gives each device whole heads); choose model from 1, 2, 4, 8."),
        (V5E_256, LLAMA_8B_HEADS, 256, {"mesh": MeshConfig(data=1, fsdp=4, model=64)},
         "model=64 of the mesh (data=1 x fsdp=4 x experts=1 x model=64) does not divide the model's num_heads=32"),
        (ResourceConfig.with_tpu("v5litepod-64"), MOE, 64, {"mesh": MeshConfig(data=1, fsdp=4, experts=16)},
         "experts=16 of the mesh (data=1 x fsdp=4 x experts=16 x model=1) does not divide the model's num_experts=8 "
         "(expert parallelism gives each device whole experts); choose experts from 1, 2, 4, 8."),
        (ResourceConfig.with_cpu(replicas=4), LLAMA_8B_HEADS, 6, {"mesh": MeshConfig(data=1, fsdp=6)},
         "Mesh data=1 x fsdp=6 x experts=1 x model=1 has 6 devices, which do not spread evenly over the 4 processes "
         "of with_cpu(replicas=4); make it a multiple of 4."),
        (V5E_256, LLAMA_8B_HEADS, 256, {"mesh": {"fsdp": 256}}, "mesh must be a MeshConfig(data=..., fsdp=..."),
    ],
)
def test_a_mesh_that_does_not_fit_is_refused_in_one_line_naming_the_numbers(resources, model, batch, options, message):
    with pytest.raises(MeshConfigError) as caught:
        choose_mesh(resources, model, batch, **options)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"fsdp": 0}, "Mesh axis sizes must be positive integers (or -1 for one axis); got fsdp=0."),
        ({"model": True}, "got model=True"),
        ({"fsdp": -1}, "At most one mesh axis may be -1 (the remaining devices); got data=-1 x fsdp=-1 x experts=1 x "
                       "model=1 (data is -1 unless given: MeshConfig(data=1, ...))."),
    ],
)
def test_impossible_mesh_sizes_are_refused_when_written(sizes, message):
    with pytest.raises(MeshConfigError) as caught:
        MeshConfig(**sizes)
    assert message in str(caught.value)


def _devices(processes: int, per_process: int) -> list:
    return [SimpleNamespace(id=p * per_process + i, process_index=p) for p in range(processes) for i in range(per_process)]


def test_a_mesh_smaller_than_the_devices_takes_an_equal_share_of_every_process():
    devices = _devices(processes=4, per_process=2)
    assert [d.id for d in mesh_devices(devices, MeshConfig(data=4))] == [0, 2, 4, 6]
    assert mesh_devices(devices, MeshConfig(data=1, fsdp=8)) == devices
    assert mesh_devices(devices, MeshConfig(data=-1)) == devices
    with pytest.raises(MeshConfigError, match="do not spread evenly over the 4 processes"):
        mesh_devices(devices, MeshConfig(data=2))
    with pytest.raises(MeshConfigError, match="needs 16 devices; only 8 are visible"):
        mesh_devices(devices, MeshConfig(data=16))


def test_choosing_a_mesh_asks_jax_for_no_device():
    # A planner chooses the mesh for a pod it does not have: nothing may start JAX's backend.
    program = (
        "from fray.cluster import ResourceConfig\n"
        "from levanter.models.llama import LlamaConfig\n"
        "from levanter.trainer.mesh_choice import choose_mesh\n"
        "from jax._src import xla_bridge\n"
        "model = LlamaConfig(hidden_dim=4096, intermediate_dim=14336, num_layers=32, num_heads=32, num_kv_heads=8)\n"
        "print(choose_mesh(ResourceConfig.with_tpu('v5litepod-256'), model, 256).describe(), "
        "xla_bridge.backends_are_initialized())\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "data=1 x fsdp=256 x experts=1 x model=1 False", done.stderr[-3000:]
