"""How devices are laid out on the mesh: in the order given on CPUs and GPUs; on TPUs spanning several
slices, the slices split the data axis (JAX's mesh_utils lays out each slice's chips by the torus)."""

from types import SimpleNamespace

import jax
import pytest

from haliax.partitioning import PartitioningError, device_grid, make_mesh


def test_cpu_devices_keep_their_order_in_the_mesh():
    devices = jax.devices()[:4]
    grid = device_grid(devices, [2, 2, 1, 1])
    assert grid.shape == (2, 2, 1, 1) and list(grid.ravel()) == devices
    assert make_mesh(data=1, fsdp=-1, devices=devices).shape == {"data": 1, "fsdp": 4, "experts": 1, "model": 1}


def test_tpu_slices_that_do_not_split_the_data_axis_are_refused():
    # Two slices of four chips: data=1 would put fsdp's per-layer gathers across the data-centre network.
    chips = [SimpleNamespace(id=s * 4 + i, platform="tpu", slice_index=s) for s in range(2) for i in range(4)]
    with pytest.raises(PartitioningError, match="span 2 TPU slices, which must split the data axis \\(data=1\\)"):
        device_grid(chips, [1, 8, 1, 1])
