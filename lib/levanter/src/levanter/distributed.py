"""Joining JAX's multi-process runtime when a job runs as several replicas (one process per host).

A job launched with ``replicas > 1`` starts the same command once per host; every process must
call :func:`jax.distributed.initialize` with the same coordinator address and process count and
its own index before JAX touches a device. After that ``jax.devices()`` lists the devices of every
process, the trainer's mesh spans them all, and each process feeds only its own rows of each
global batch.

The settings come from the environment; for each, the iris name wins over JAX's own:

* coordinator ``host:port``: ``IRIS_COORDINATOR_ADDRESS`` or ``JAX_COORDINATOR_ADDRESS``;
* number of processes: ``IRIS_NUM_REPLICAS`` or ``JAX_NUM_PROCESSES``;
* this process's index (``0 .. N-1``): ``IRIS_REPLICA_INDEX`` or ``JAX_PROCESS_ID``;
* where process 0's coordinator listens: ``JAX_COORDINATOR_BIND_ADDRESS``. Unset, a loopback
  coordinator address (every process on this machine, as iris's local backend runs them) is also
  the bind address, so nothing off the machine can reach the coordinator; any other address keeps
  JAX's default of every interface, since other hosts must connect.

One process (no variables, or a count of 1) needs nothing and nothing is done. On Cloud TPU and
under SLURM, JAX finds these settings on its own; set ``LEVANTER_JAX_DISTRIBUTED=auto`` there to
call ``jax.distributed.initialize()`` without arguments.

Writing what the processes trained together (a Hugging Face export) is one process's job:
:func:`gathered_on_process_0` brings each array whole to process 0, and :func:`wait_for_every_process`
holds the others until it has written.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax

from levanter.errors import LevanterError

logger = logging.getLogger("levanter.distributed")

_NAMES = {
    "coordinator_address": ("IRIS_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS"),
    "num_processes": ("IRIS_NUM_REPLICAS", "JAX_NUM_PROCESSES"),
    "process_id": ("IRIS_REPLICA_INDEX", "JAX_PROCESS_ID"),
}
AUTO_VARIABLE = "LEVANTER_JAX_DISTRIBUTED"
BIND_ADDRESS_VARIABLE = "JAX_COORDINATOR_BIND_ADDRESS"


class DistributedConfigError(LevanterError, RuntimeError):
    """The multi-process settings in the environment are incomplete or contradict each other."""


@dataclass(frozen=True)
class DistributedConfig:
    coordinator_address: str
    num_processes: int
    process_id: int
    initialization_timeout_s: int = 120
    coordinator_bind_address: str | None = None  # None: JAX's default, every interface


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def distributed_config_from_env(environ: Mapping[str, str] | None = None) -> DistributedConfig | None:
    """The settings for this process, or ``None`` when it runs alone."""
    environ = os.environ if environ is None else environ
    found = {key: _first(environ, names) for key, names in _NAMES.items()}
    count = found["num_processes"]
    if count is None:
        if found["coordinator_address"] or found["process_id"]:
            raise DistributedConfigError(
                f"A coordinator address or process index is set but not the process count; set "
                f"{' or '.join(_NAMES['num_processes'])} as well (or unset the others to run alone)."
            )
        return None
    num_processes = _parse_int(*count)
    if num_processes <= 1:
        return None
    missing = [" or ".join(_NAMES[key]) for key in ("coordinator_address", "process_id") if found[key] is None]
    if missing:
        raise DistributedConfigError(
            f"{count[0]}={num_processes} asks for a multi-process run, but {' and '.join(missing)} "
            "is not set; every process needs the coordinator's host:port and its own index."
        )
    process_id = _parse_int(*found["process_id"])
    if not 0 <= process_id < num_processes:
        raise DistributedConfigError(
            f"{found['process_id'][0]}={process_id} is outside 0..{num_processes - 1} ({count[0]}={num_processes})."
        )
    address = found["coordinator_address"][1]
    if ":" not in address:
        raise DistributedConfigError(
            f"{found['coordinator_address'][0]}={address!r} needs a port, e.g. '10.0.0.2:8476'."
        )
    bind = environ.get(BIND_ADDRESS_VARIABLE, "").strip() or (address if _is_loopback(address) else None)
    return DistributedConfig(address, num_processes, process_id, coordinator_bind_address=bind)


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def _parse_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DistributedConfigError(f"{name}={value!r} is not an integer.") from None


def is_initialized() -> bool:
    from jax._src import distributed

    return distributed.global_state.client is not None


def initialize_distributed(config: DistributedConfig | None = None) -> bool:
    """Join the multi-process runtime if the environment (or ``config``) asks for it.

    Returns whether this process is part of a multi-process run. Safe to call more than once.
    Must run before anything asks JAX for its devices.
    """
    if is_initialized():
        return True
    if config is None and os.environ.get(AUTO_VARIABLE, "").lower() == "auto":
        jax.distributed.initialize()
        return jax.process_count() > 1
    config = config or distributed_config_from_env()
    if config is None:
        return False
    if _backend_started():
        raise DistributedConfigError(
            f"This process should join a {config.num_processes}-process JAX run, but JAX already started "
            "its devices; jax.distributed must be initialised first. Call "
            "levanter.distributed.initialize_distributed() (or build the Trainer) before any other JAX work "
            "(jax.devices(), jax.process_index(), device_put, jit calls)."
        )
    if _platforms_include_cpu():
        # Cross-process collectives on CPU devices need an implementation; gloo ships with jaxlib.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logger.info(
        "Joining a %d-process JAX run as process %d (coordinator %s).",
        config.num_processes, config.process_id, config.coordinator_address,
    )
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        initialization_timeout=config.initialization_timeout_s,
        coordinator_bind_address=config.coordinator_bind_address,
    )
    logger.info("Process %d of %d: %d local devices, %d in all.", jax.process_index(), jax.process_count(),
                jax.local_device_count(), jax.device_count())
    return True


def _backend_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _platforms_include_cpu() -> bool:
    platforms = (os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or "").lower()
    return not platforms or "cpu" in platforms


def gathered_on_process_0(tree: Any) -> Any:
    """``tree`` with every array whole on this host, on process 0; ``None`` on the other processes.

    In a multi-process run each process holds only its own shards of a sharded array. Every process
    must call this, in the same order as the others (each array is gathered by a collective), and
    only process 0 keeps what was gathered, so the others hold no more than one array at a time.
    With one process, ``tree`` as it is.
    """
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    keep = jax.process_index() == 0
    leaves, structure = jax.tree.flatten(tree)
    gathered = []
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        gathered.append(leaf if keep else None)
    return jax.tree.unflatten(structure, gathered) if keep else None


def wait_for_every_process(name: str) -> None:
    """Return once every process of the run has reached the point called ``name`` (at once with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
