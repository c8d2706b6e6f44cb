"""Cluster-facing types of fray: resource requests, the ``DistributedClient`` protocol and its backends,
and :func:`client_for`, which turns a setting such as ``"processes"`` or ``"ray"`` into a client.

``RayClient`` lives in :mod:`fray.cluster.ray_client` and imports Ray only when used.
"""

from fray.cluster.client import (
    ActorHandle,
    DistributedClient,
    InvalidJobRequest,
    JobHandle,
    JobRequest,
    JobStatus,
    ScaleUpTimeout,
    UnschedulableError,
)
from fray.cluster.current import ClusterConfigError, client_for, client_from_spec, current_client, use_client
from fray.cluster.local import LocalClient
from fray.cluster.main_guard import UnguardedMainError
from fray.cluster.pickling import ship_by_value
from fray.cluster.resources import (
    CpuDevice,
    GpuDevice,
    InvalidResourceConfig,
    ResourceConfig,
    TpuDevice,
    parse_size,
)
from fray.cluster.task_map import TaskError, WorkerLostError, WorkerStartupError


def __getattr__(name: str):
    # RayClient without importing ray (or its module) until someone asks for it.
    if name == "RayClient":
        from fray.cluster.ray_client import RayClient

        return RayClient
    raise AttributeError(name)


__all__ = [
    "ActorHandle",
    "ClusterConfigError",
    "CpuDevice",
    "DistributedClient",
    "GpuDevice",
    "InvalidJobRequest",
    "InvalidResourceConfig",
    "JobHandle",
    "JobRequest",
    "JobStatus",
    "LocalClient",
    "RayClient",
    "ResourceConfig",
    "ScaleUpTimeout",
    "TaskError",
    "TpuDevice",
    "UnguardedMainError",
    "UnschedulableError",
    "WorkerLostError",
    "WorkerStartupError",
    "client_for",
    "client_from_spec",
    "current_client",
    "parse_size",
    "ship_by_value",
    "use_client",
]
