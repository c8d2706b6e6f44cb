"""Which client a program uses.

First match wins:

1. an explicit client passed to the code that runs work (``StepRunner(client=...)``), or one
   installed for a block with ``with use_client(client):``;
2. configuration: the ``MARIN_CLUSTER`` environment variable, else ``cluster:`` in ``marin.yaml``
   / ``[tool.marin]`` (read by :func:`rigging.config.discovery.discover_config`);
3. a :class:`LocalClient` running work in threads of this process.

A cluster setting is one of ``local`` (threads), ``local:processes``, ``ray`` or ``ray:auto`` (the
Ray cluster this machine belongs to), ``ray:local`` (start a private local Ray cluster) and
``ray://HOST:PORT`` (Ray client connection).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from rigging.config.discovery import ConfigError, discover_config

from fray.cluster.client import DistributedClient
from fray.cluster.local import LocalClient

_installed: list[DistributedClient] = []  # use_client blocks, innermost last
_from_config: dict[str, DistributedClient] = {}
_lock = threading.Lock()


class ClusterConfigError(ConfigError):
    """A cluster setting that names no known backend."""


def client_from_spec(spec: str) -> DistributedClient:
    """A client for a cluster setting such as ``"local"``, ``"ray:auto"`` or ``"ray://head:10001"``."""
    text = spec.strip()
    if text in ("", "local", "local:threads"):
        return LocalClient()
    if text == "local:processes":
        return LocalClient(processes=True)
    if text in ("ray", "ray:auto"):
        from fray.cluster.ray_client import RayClient

        return RayClient("auto")
    if text == "ray:local":
        from fray.cluster.ray_client import RayClient

        return RayClient(None)
    if text.startswith("ray://"):
        from fray.cluster.ray_client import RayClient

        return RayClient(text)
    raise ClusterConfigError(
        f"Unknown cluster setting {spec!r}. Use 'local', 'local:processes', 'ray:auto', 'ray:local' or "
        "'ray://HOST:PORT' (in MARIN_CLUSTER or as 'cluster:' in marin.yaml)."
    )


def configured_cluster() -> str | None:
    """The cluster setting from configuration, or ``None`` when there is none."""
    return discover_config(check_prefix=False).cluster


def current_client() -> DistributedClient:
    """The client to use now; see the module docstring for the order."""
    if _installed:
        return _installed[-1]
    spec = configured_cluster()
    if not spec:
        spec = "local"
    with _lock:
        if spec not in _from_config:
            _from_config[spec] = client_from_spec(spec)
        return _from_config[spec]


@contextlib.contextmanager
def use_client(client: DistributedClient) -> Iterator[DistributedClient]:
    """Make ``client`` the current one in this process for the block (threads started inside see it too)."""
    _installed.append(client)
    try:
        yield client
    finally:
        _installed.remove(client)
