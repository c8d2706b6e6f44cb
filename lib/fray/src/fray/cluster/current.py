"""Which client runs a piece of work: the one place a setting such as ``"processes"`` becomes a client.

A setting, wherever it is given (``backend=`` of a zephyr run or a tokenize step, ``MARIN_CLUSTER``,
``cluster:`` in ``marin.yaml``):

* ``inline``: ``LocalClient(inline=True)``, the calling thread, one task after another;
* ``threads`` (also ``local``, ``local:threads``): ``LocalClient()``, threads of this process;
* ``processes`` (also ``local:processes``): ``LocalClient(processes=True)``, local worker processes;
* ``ray`` (also ``ray:auto``): the Ray cluster this machine belongs to;
* ``ray:autoscaling``: the same, for a cluster that adds nodes on demand (``ray up``): work no live
  node can hold yet, but a node type of its autoscaler can, waits for the node (up to
  ``ResourceConfig.scale_up_timeout_s``) instead of failing at once; ``RayClient(autoscaling=True)``.
  Plain ``ray`` asks the cluster whether it autoscales, and does the same when it does;
* ``ray:local``: a private local Ray cluster, started on first use;
* ``ray://HOST:PORT``: a Ray client connection;
* ``slurm``: ``SlurmClient()``, the Slurm cluster of this machine's Slurm commands (``SLURM_CONF``),
  its default partition; ``slurm:PARTITION``: that partition;
* ``iris:ENGINE`` (``iris:slurm``, ``iris:slurm:PARTITION``, ``iris:ray``, ``iris:ray:autoscaling``,
  ``iris:ray:local``, ``iris:ray://HOST:PORT``, ``iris:local``): steps run as iris jobs on ENGINE, with retries on
  preemption and failure (see ``marin.execution.running.iris_steps``); any other work (a remote call, a
  pipeline's shards) gets ENGINE's client, as if the setting were ENGINE alone.

The current client, first match wins:

1. an explicit client passed to the code that runs work (``StepRunner(client=...)``), or one
   installed for a block with ``with use_client(client):``;
2. configuration: the ``MARIN_CLUSTER`` environment variable, else ``cluster:`` in ``marin.yaml``
   / ``[tool.marin]`` (read by :func:`rigging.config.discovery.discover_config`);
3. a :class:`LocalClient` running work in threads of this process.

:func:`client_for` resolves any choice (a client, a setting, or ``None`` for the current client);
``"ray"`` there means the program's own Ray client when the current one is a ``RayClient``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from rigging.config.discovery import ConfigError, discover_config

from fray.cluster.client import DistributedClient
from fray.cluster.local import LocalClient
from fray.errors import FrayError

_installed: list[DistributedClient] = []  # use_client blocks, innermost last
_from_settings: dict[str, DistributedClient] = {}  # one client per setting, shared by its users
_lock = threading.Lock()

_LOCAL_SETTINGS: dict[str, dict[str, bool]] = {
    "inline": {"inline": True},
    "local:inline": {"inline": True},
    "in_process": {"inline": True},
    "sync": {"inline": True},
    "": {},
    "local": {},
    "local:threads": {},
    "threads": {},
    "processes": {"processes": True},
    "local:processes": {"processes": True},
    "process_pool": {"processes": True},
}
_RAY_SETTINGS: dict[str, str | None] = {"ray": "auto", "ray:auto": "auto", "ray:local": None}


class ClusterConfigError(FrayError, ConfigError):
    """A cluster setting that names no known backend."""


IRIS_PREFIX = "iris:"


def split_orchestrator(setting: str) -> tuple[str | None, str]:
    """``("iris", "slurm:gpu")`` for ``"iris:slurm:gpu"``; ``(None, setting)`` for a plain engine setting."""
    text = setting.strip()
    if text.startswith(IRIS_PREFIX):
        return "iris", text.removeprefix(IRIS_PREFIX) or "local"
    return None, text


def client_from_spec(spec: str, *, what: str = "cluster setting") -> DistributedClient:
    """A new client for a setting such as ``"processes"``, ``"ray:auto"`` or ``"ray://head:10001"``
    (``iris:ENGINE``: ENGINE's client)."""
    text = split_orchestrator(spec)[1]
    if text in _LOCAL_SETTINGS:
        return LocalClient(**_LOCAL_SETTINGS[text])
    if text == "ray:autoscaling":
        from fray.cluster.ray_client import RayClient

        return RayClient("auto", autoscaling=True)
    if text in _RAY_SETTINGS or text.startswith("ray://"):
        from fray.cluster.ray_client import RayClient

        return RayClient(_RAY_SETTINGS.get(text, text))
    if text == "slurm" or (text.startswith("slurm:") and text != "slurm:"):
        from fray.cluster.slurm_client import SlurmClient

        return SlurmClient(text.partition(":")[2] or None)
    raise ClusterConfigError(
        f"Unknown {what} {spec!r}. Use 'inline', 'threads', 'processes', 'ray' or 'slurm' (also 'local', "
        "'local:processes', 'ray:auto', 'ray:autoscaling', 'ray:local', 'ray://HOST:PORT' or 'slurm:PARTITION'), as backend=..., "
        "in MARIN_CLUSTER or as 'cluster:' in marin.yaml; 'iris:ENGINE' runs steps as iris jobs on one of them."
    )


def configured_cluster() -> str | None:
    """The cluster setting from configuration, or ``None`` when there is none."""
    return discover_config(check_prefix=False).cluster


def _shared_client(spec: str, what: str) -> DistributedClient:
    with _lock:
        if spec not in _from_settings:
            _from_settings[spec] = client_from_spec(spec, what=what)
        return _from_settings[spec]


_UNREAD: Any = object()


def current_client(setting: str | None = _UNREAD) -> DistributedClient:
    """The client to use now; see the module docstring for the order.

    ``setting``: what :func:`configured_cluster` answered, for a caller that has just asked it (the
    configuration is then not looked up a second time).
    """
    if _installed:
        return _installed[-1]
    if setting is _UNREAD:
        setting = configured_cluster()
    return _shared_client(setting or "local", "cluster setting")


def client_for(choice: DistributedClient | str | None, *, what: str = "backend") -> DistributedClient:
    """The client ``choice`` names: a client as it is, ``None`` the current client, a setting its
    (shared) client. ``what`` names the argument in the error for an unknown setting."""
    if choice is None:
        return current_client()
    if not isinstance(choice, str):
        if isinstance(choice, DistributedClient):
            return choice
        raise TypeError(f"{what} must be a fray client or a setting such as 'processes' or 'ray', got {choice!r}")
    spec = choice.strip()
    if spec == "ray":
        current = current_client()
        if _is_ray_client(current):
            return current  # the cluster the program chose (use_client, MARIN_CLUSTER=ray:..., marin.yaml)
    return _shared_client(spec, what)


def _is_ray_client(client: Any) -> bool:
    from fray.cluster.ray_client import RayClient

    return isinstance(client, RayClient)


@contextlib.contextmanager
def use_client(client: DistributedClient) -> Iterator[DistributedClient]:
    """Make ``client`` the current one in this process for the block (threads started inside see it too)."""
    _installed.append(client)
    try:
        yield client
    finally:
        _installed.remove(client)
