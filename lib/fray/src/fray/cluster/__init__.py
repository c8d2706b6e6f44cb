"""Cluster-facing types of fray: resource requests (and, later, clients)."""

from fray.cluster.resources import (
    CpuDevice,
    GpuDevice,
    InvalidResourceConfig,
    ResourceConfig,
    TpuDevice,
    parse_size,
)

__all__ = ["CpuDevice", "GpuDevice", "InvalidResourceConfig", "ResourceConfig", "TpuDevice", "parse_size"]
