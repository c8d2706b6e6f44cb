"""What a piece of work needs to run: CPUs, memory, disk and accelerators.

A ``ResourceConfig`` describes *placement*, never *identity*: two steps that differ only in their
resources compute the same thing, so the execution engine leaves resources out of step hashes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fray.cluster.accelerators import TpuSlice, UnknownTpuType, tpu_slice
from fray.errors import FrayError

DeviceKind = Literal["cpu", "gpu", "tpu"]


class InvalidResourceConfig(FrayError, ValueError):
    """A resource request that no cluster could ever satisfy as written."""


KNOWN_GPU_VARIANTS = (
    "A100",
    "A100-40G",
    "A100-80G",
    "H100",
    "H200",
    "B200",
    "L4",
    "A10G",
    "T4",
    "V100",
    "RTX4090",
    "auto",
)


@dataclass(frozen=True)
class CpuDevice:
    kind: Literal["cpu"] = "cpu"


@dataclass(frozen=True)
class GpuDevice:
    variant: str
    count: int
    kind: Literal["gpu"] = "gpu"


@dataclass(frozen=True)
class TpuDevice:
    """A TPU slice (``type``, e.g. ``v4-32``) times ``slice_count``.

    ``type`` is kept in the TPU API's spelling, the one Ray labels hosts with: ``TpuDevice("v5e-16")``
    and ``TpuDevice("v5litepod-16")`` are the same device. Hosts, chips and vCPUs come from
    :mod:`fray.cluster.accelerators`.
    """

    type: str
    slice_count: int = 1
    kind: Literal["tpu"] = "tpu"

    def __post_init__(self) -> None:
        try:
            canonical = tpu_slice(self.type).name
        except UnknownTpuType as error:
            raise InvalidResourceConfig(str(error)) from None
        object.__setattr__(self, "type", canonical)

    @property
    def slice(self) -> TpuSlice:
        return tpu_slice(self.type)

    @property
    def chips_per_slice(self) -> int:
        return self.slice.chips

    @property
    def hosts_per_slice(self) -> int:
        return self.slice.hosts

    @property
    def chips_per_host(self) -> int:
        return self.slice.host.chips


Device = CpuDevice | GpuDevice | TpuDevice


# How long work waits for an autoscaler to add a node that can hold it: cloud VMs with GPUs
# usually boot and install in a few minutes, so 15 leaves room without hiding a group that never comes.
DEFAULT_SCALE_UP_TIMEOUT_S = 15 * 60.0

# Resource names a cluster defines itself; ``custom`` may not use them (cpu=, ram= and the device say these).
_BUILTIN_RESOURCES = {"CPU": "cpu=", "GPU": "with_gpu(...)", "TPU": "with_tpu(...)", "memory": "ram=",
                      "object_store_memory": "ram="}


@dataclass(frozen=True)
class ResourceConfig:
    """Resources for one replica of a job or step, plus how many replicas to run.

    Build one with ``ResourceConfig.with_cpu()``, ``with_gpu(variant, count)`` or
    ``with_tpu(type, slice_count)``; every constructor validates, so an impossible request fails
    where it is written rather than hanging in a cluster queue.

    Retry budgets and a time limit travel with the request too, as orchestration (iris) reads them
    when a step runs as a job: ``max_retries_preemption`` retries after a preemption (the machine was
    reclaimed; the work resumes from its checkpoint), ``max_retries_failure`` after any other failure,
    and ``time_limit_s`` ends an attempt that runs longer (a failure). Like the rest, they are placement,
    never identity.

    ``scale_up_timeout_s`` is how long work no live node can hold waits for a cluster's autoscaler to
    add a node that can (a GPU group kept at zero nodes while idle); past it the work fails with
    ``ScaleUpTimeout``. A large TPU slice may need longer than the default 15 minutes.

    ``custom`` asks for resources a cluster's nodes declare themselves (on Ray,
    ``ray start --resources='{"trainer": 1}'``): ``custom={"trainer": 1}`` runs the work only on a
    node that has one ``trainer`` free. Given as a mapping, kept as sorted ``(name, amount)`` pairs
    so the config stays hashable; ``dict(config.custom)`` reads it back.
    """

    cpu: float = 1
    ram: str = "4g"
    disk: str = "16g"
    device: Device = field(default_factory=CpuDevice)
    preemptible: bool = True
    regions: tuple[str, ...] = ()
    replicas: int = 1
    custom: Mapping[str, float] | tuple[tuple[str, float], ...] = ()
    max_retries_preemption: int = 10
    max_retries_failure: int = 0
    time_limit_s: float | None = None
    scale_up_timeout_s: float = DEFAULT_SCALE_UP_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.cpu > 0:
            raise InvalidResourceConfig(f"cpu must be positive, got {self.cpu!r}.")
        for name in ("ram", "disk"):
            parse_size(getattr(self, name), what=name)
        if isinstance(self.device, GpuDevice):
            if self.device.count < 1:
                raise InvalidResourceConfig(f"GPU count must be at least 1, got {self.device.count!r}.")
            if not self.device.variant:
                raise InvalidResourceConfig("GPU variant must be a non-empty string such as 'H100'.")
        if isinstance(self.device, TpuDevice):
            if self.device.slice_count < 1:
                raise InvalidResourceConfig(f"TPU slice_count must be at least 1, got {self.device.slice_count!r}.")
        if self.replicas < 1:
            raise InvalidResourceConfig(f"replicas must be at least 1, got {self.replicas!r}.")
        for budget in ("max_retries_preemption", "max_retries_failure"):
            value = getattr(self, budget)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidResourceConfig(f"{budget} must be a whole number, 0 or more, got {value!r}.")
        if self.time_limit_s is not None and not (isinstance(self.time_limit_s, (int, float)) and self.time_limit_s > 0):
            raise InvalidResourceConfig(f"time_limit_s must be a positive number of seconds, got {self.time_limit_s!r}.")
        if isinstance(self.scale_up_timeout_s, bool) or not isinstance(self.scale_up_timeout_s, (int, float)) \
                or not self.scale_up_timeout_s > 0:
            raise InvalidResourceConfig(
                f"scale_up_timeout_s must be a positive number of seconds, got {self.scale_up_timeout_s!r}."
            )
        if isinstance(self.regions, list):
            object.__setattr__(self, "regions", tuple(self.regions))
        object.__setattr__(self, "custom", _custom_resources(self.custom))

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def with_cpu(cls, cpu: float = 1, ram: str = "4g", disk: str = "16g", **kwargs: Any) -> "ResourceConfig":
        return cls(cpu=cpu, ram=ram, disk=disk, device=CpuDevice(), **kwargs)

    @classmethod
    def with_gpu(cls, variant: str = "auto", count: int = 1, *, cpu: float = 1, ram: str = "16g", **kwargs: Any) -> "ResourceConfig":
        return cls(cpu=cpu, ram=ram, device=GpuDevice(variant=variant, count=count), **kwargs)

    @classmethod
    def with_tpu(cls, tpu_type: str, slice_count: int = 1, *, cpu: float = 1, ram: str = "16g", **kwargs: Any) -> "ResourceConfig":
        device = TpuDevice(type=tpu_type, slice_count=slice_count)
        # One replica per host (TPU VM) of every slice: each runs one JAX process on its host's chips.
        kwargs.setdefault("replicas", device.hosts_per_slice * slice_count)
        return cls(cpu=cpu, ram=ram, device=device, **kwargs)

    # -- queries ------------------------------------------------------------------------------

    @property
    def device_kind(self) -> DeviceKind:
        return self.device.kind

    @property
    def gpu_count(self) -> int:
        return self.device.count if isinstance(self.device, GpuDevice) else 0

    @property
    def ram_bytes(self) -> int:
        return parse_size(self.ram, what="ram")

    @property
    def disk_bytes(self) -> int:
        return parse_size(self.disk, what="disk")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _custom_resources(custom: Any) -> tuple[tuple[str, float], ...]:
    """``custom`` as sorted ``(name, amount)`` pairs, refusing names and amounts no cluster takes."""
    pairs = custom.items() if isinstance(custom, Mapping) else custom
    try:
        pairs = [(name, amount) for name, amount in pairs]
    except (TypeError, ValueError):
        raise InvalidResourceConfig(
            f"custom must map resource names to amounts, like custom={{'trainer': 1}}; got {custom!r}."
        ) from None
    checked: dict[str, float] = {}
    for name, amount in pairs:
        if not isinstance(name, str) or not name.strip():
            raise InvalidResourceConfig(f"custom resource names must be non-empty strings, got {name!r}.")
        if name in _BUILTIN_RESOURCES:
            raise InvalidResourceConfig(
                f"custom resource {name!r} is built in; ask for it with {_BUILTIN_RESOURCES[name]} instead."
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount <= 0:
            raise InvalidResourceConfig(f"custom resource {name!r} needs a positive amount, got {amount!r}.")
        # Clusters hand out whole units above one (Ray refuses 1.5 of a resource, but takes 0.5).
        if amount > 1 and amount != int(amount):
            raise InvalidResourceConfig(
                f"custom resource {name!r}: amounts above 1 must be whole numbers, got {amount!r}."
            )
        if name in checked:
            raise InvalidResourceConfig(f"custom resource {name!r} is given twice.")
        checked[name] = float(amount)
    return tuple(sorted(checked.items()))


_SIZE = re.compile(r"^\s*(?P<num>\d+(\.\d+)?)\s*(?P<unit>[kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_size(text: str | int, *, what: str = "size") -> int:
    """Bytes in a human size such as ``"16g"``, ``"512MiB"`` or ``1024``."""
    if isinstance(text, int):
        if text < 0:
            raise InvalidResourceConfig(f"{what} must not be negative, got {text}.")
        return text
    match = _SIZE.match(str(text))
    if match is None:
        raise InvalidResourceConfig(f"{what} {text!r} is not a size; write it like '4g', '512m' or '16GiB'.")
    unit = (match["unit"] or "").lower().rstrip("b").rstrip("i")
    value = int(float(match["num"]) * _UNITS[unit])
    if value <= 0:
        raise InvalidResourceConfig(f"{what} must be positive, got {text!r}.")
    return value
