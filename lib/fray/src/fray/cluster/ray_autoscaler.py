"""What a Ray cluster's autoscaler can add, and how long work waits for it.

A cluster launched with ``ray up`` (the one ``infra/`` writes) keeps its costly worker groups at
zero nodes while idle: its autoscaler (``monitor.py`` on the head, started with
``--autoscaling-config``) adds a node of a type whose declared resources hold a pending request and
removes it once idle. So when no live node can hold a request, the answer is "wait" if some node
type can, and "never" only if none can. This module gives that answer from the autoscaler's own
config, so fray and the autoscaler agree on it (a node type that does not declare a resource has
none of it, as Ray's autoscaler counts):

* :func:`find_autoscaler` reads the node types from the config file the cluster's autoscaler runs
  with, found through the monitor process of that cluster: on this machine when the driver runs on
  the head (``ray submit``, ``ray exec``), else through a small task on the head node. A monitor
  started without a config (``ray start --head``, ``ray.init()``) means the cluster does not
  autoscale. Ray keeps no copy of the node types where a driver could ask for them.
* :func:`plan_scale_up` decides for one request: ``None`` when a live node holds it, a
  :class:`ScaleUp` (the node types that hold it, the deadline) when the autoscaler can add one,
  else :class:`UnschedulableError` in one line naming the missing resource.
* :class:`ScaleUpWatch` keeps the deadline: work whose node has not joined after
  ``ResourceConfig.scale_up_timeout_s`` (15 minutes by default) is failed with
  :class:`ScaleUpTimeout`, which says which resource and how long.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigging.log import get_logger

from fray.cluster.client import ScaleUpTimeout, UnschedulableError

logger = get_logger(__name__)

# The node whose raylet runs next to the autoscaler declares this resource (Ray's own).
_HEAD_RESOURCE = "node:__internal_head__"
# How long the lookup task on the head may take (a worker process starts there first).
_LOOKUP_TIMEOUT_S = 60.0
# The GiB figure in messages; memory is counted in bytes.
_GIB = float(1 << 30)

NodeResources = Mapping[str, float]


@dataclass(frozen=True)
class NodeType:
    """One entry of the autoscaler's ``available_node_types``: a worker group."""

    name: str
    resources: tuple[tuple[str, float], ...]
    max_workers: int

    @property
    def declared(self) -> dict[str, float]:
        return dict(self.resources)


@dataclass(frozen=True)
class Autoscaler:
    """The autoscaler of a Ray cluster. ``node_types`` is ``None`` when the cluster may autoscale but
    its node types could not be read from here (no monitor found on this machine or the head)."""

    node_types: tuple[NodeType, ...] | None
    head_type: str | None = None
    source: str = ""

    def addable(self) -> tuple[NodeType, ...]:
        """The node types it can start nodes of (not the head's, not those capped at zero)."""
        return tuple(t for t in self.node_types or () if t.name != self.head_type and t.max_workers > 0)


def autoscaler_from_config(config: Mapping[str, Any], *, source: str = "") -> Autoscaler:
    """The node types of a Ray cluster config (a ``ray up`` file, or the autoscaler's own copy)."""
    types = config.get("available_node_types")
    if not isinstance(types, Mapping):  # a legacy file: Ray fills its node types in itself
        return Autoscaler(None, source=source)
    default_max = int(config.get("max_workers", 0) or 0)
    node_types = []
    for name, spec in types.items():
        spec = spec or {}
        resources = {str(k): float(v) for k, v in (spec.get("resources") or {}).items()}
        node_types.append(NodeType(str(name), tuple(sorted(resources.items())), int(spec.get("max_workers", default_max))))
    return Autoscaler(tuple(node_types), config.get("head_node_type"), source)


# -- finding the autoscaler ------------------------------------------------------------------------


def _read_config(path: str) -> Mapping[str, Any]:
    import yaml  # Ray's own dependency; a JSON file is YAML too

    with open(os.path.expanduser(path)) as handle:
        return yaml.safe_load(handle) or {}


def _monitor_arguments(gcs_port: int) -> list[str] | None:
    """The command line of the autoscaler's monitor of the cluster whose GCS listens on ``gcs_port``,
    if it runs on this machine (a cluster's port is unique on its host)."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # not Linux: nothing to find here
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(arg.endswith("monitor.py") and "autoscaler" in arg for arg in args):
            continue
        address = next((arg.partition("=")[2] for arg in args if arg.startswith("--gcs-address=")), "")
        if address.rpartition(":")[2] == str(gcs_port):
            return args
    return None


def autoscaler_on_this_machine(gcs_address: str | None = None) -> tuple[str, dict[str, Any] | None, str]:
    """``("none" | "config" | "unknown", config, where)`` for the cluster's monitor on this machine.

    ``gcs_address`` defaults to the cluster this process is connected to. Plain data, so it travels
    back from the task that runs it on the head.
    """
    if gcs_address is None:
        import ray

        gcs_address = ray.get_runtime_context().gcs_address
    port = int(str(gcs_address).rpartition(":")[2])
    args = _monitor_arguments(port)
    if args is None:
        return "unknown", None, ""
    path = next((arg.partition("=")[2] for arg in args if arg.startswith("--autoscaling-config=")), "")
    if not path:
        return "none", None, ""
    try:
        return "config", dict(_read_config(path)), path
    except (OSError, ValueError) as error:  # yaml's errors are ValueErrors
        logger.warning("Cannot read the autoscaler's config %s: %s", path, error)
        return "unknown", None, path


def find_autoscaler(ray: Any, *, remote_driver: bool) -> Autoscaler | None:
    """The autoscaler of the cluster ``ray`` is connected to; ``None`` when it has none.

    Looks on this machine first; a driver elsewhere (``remote_driver``, or no monitor found here) asks
    the head node with a task. ``Autoscaler(node_types=None)`` when neither place answers.
    """
    found: tuple[str, dict[str, Any] | None, str] = ("unknown", None, "")
    if not remote_driver:
        try:
            found = autoscaler_on_this_machine(ray.get_runtime_context().gcs_address)
        except Exception:  # noqa: BLE001 - an address this process cannot read: ask the head
            logger.debug("no local autoscaler lookup", exc_info=True)
    if found[0] == "unknown":
        found = _ask_the_head(ray)
    kind, config, where = found
    if kind == "none":
        return None
    if kind == "config" and config is not None:
        return autoscaler_from_config(config, source=where)
    return Autoscaler(None)


def _ask_the_head(ray: Any) -> tuple[str, dict[str, Any] | None, str]:
    lookup = ray.remote(num_cpus=0, resources={_HEAD_RESOURCE: 0.001}, max_retries=0)(autoscaler_on_this_machine)
    ref = lookup.remote()
    try:
        return ray.get(ref, timeout=_LOOKUP_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - no head resource, no fray on the head, a slow start
        logger.warning("Could not ask the Ray head for its autoscaler's node types (%s: %s)", type(error).__name__, error)
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - already over
            pass
        return "unknown", None, ""


# -- deciding ----------------------------------------------------------------------------------------


def holds(node: NodeResources, needed: NodeResources) -> bool:
    """Whether a node (or node type) with ``node``'s resources can ever hold ``needed``."""
    return all(node.get(name, 0) >= amount for name, amount in needed.items())


def _quantity(name: str, amount: float) -> str:
    return f"{amount / _GIB:.3g} GiB" if name == "memory" else f"{amount:g}"


def _amount(name: str, amount: float) -> str:
    if name.startswith("accelerator_type:"):
        return name  # a label: Ray asks for a sliver of it
    return f"{name}:{_quantity(name, amount)}"


def _lacking(needed: NodeResources, nodes: Iterable[NodeResources]) -> dict[str, float]:
    nodes = list(nodes)
    return {name: amount for name, amount in needed.items() if not any(node.get(name, 0) >= amount for node in nodes)}


def describe_missing(needed: NodeResources, live: Iterable[NodeResources]) -> str:
    """``"GPU:1, accelerator_type:H100"``: what a new node must bring that no live node has; the
    accelerators and custom resources when those are missing, else every resource short."""
    lacking = _lacking(needed, live)
    special = {name: amount for name, amount in lacking.items() if name not in ("CPU", "memory")}
    shown = special or lacking or dict(needed)
    return ", ".join(_amount(name, amount) for name, amount in shown.items())


def duration(seconds: float) -> str:
    """``"15 min"``, ``"90 s"``, ``"2.5 min"``."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:g} s"


def _groups(names: tuple[str, ...]) -> str:
    if not names:
        return ""
    quoted = ", ".join(repr(name) for name in names)
    return f" (worker group {quoted})" if len(names) == 1 else f" (worker groups {quoted})"


@dataclass(frozen=True)
class ScaleUp:
    """A request that waits for the autoscaler: what for, which groups can answer, for how long."""

    what: str
    needed: tuple[tuple[str, float], ...]
    missing: str
    groups: tuple[str, ...]
    timeout_s: float

    def waiting_line(self) -> str:
        return (f"{self.what}: waiting for the autoscaler to add a node with {self.missing}{_groups(self.groups)}, "
                f"up to {duration(self.timeout_s)}")

    def timeout_error(self) -> ScaleUpTimeout:
        return ScaleUpTimeout(
            f"{self.what} waited {duration(self.timeout_s)} for the autoscaler to add a node with {self.missing}"
            f"{_groups(self.groups)}, and none joined the cluster. The autoscaler's log on the head says why (quota, "
            "capacity, a failing setup command): `tail -n 100 /tmp/ray/session_latest/logs/monitor.*`; to wait "
            "longer, set ResourceConfig(scale_up_timeout_s=...)."
        )


def plan_scale_up(needed: NodeResources, live: list[NodeResources], autoscaler: Autoscaler, *, what: str, asked: str,
                  timeout_s: float) -> ScaleUp | None:
    """``None`` if a live node holds ``needed``; a :class:`ScaleUp` if a node type of ``autoscaler`` does
    (or its node types are unknown); else :class:`UnschedulableError` naming what is missing."""
    if any(holds(node, needed) for node in live):
        return None
    key = tuple(sorted(needed.items()))
    missing = describe_missing(needed, live)
    if autoscaler.node_types is None:
        return ScaleUp(what, key, missing, (), timeout_s)
    groups = tuple(t.name for t in autoscaler.addable() if holds(t.declared, needed))
    if groups:
        return ScaleUp(what, key, missing, groups, timeout_s)
    raise UnschedulableError(
        f"{what} asks for {asked}, but no node of the Ray cluster can ever provide that: "
        f"{_why_no_type_holds(needed, live, autoscaler)}. Ask for what a worker group declares, or add a group "
        "that declares it to the cluster file (infra's `cluster.workers`)."
    )


def _why_no_type_holds(needed: NodeResources, live: list[NodeResources], autoscaler: Autoscaler) -> str:
    addable = autoscaler.addable()
    names = ", ".join(t.name for t in addable) or "none that can start nodes"
    where = f"neither its {len(live)} live node(s) nor any node type of its autoscaler ({names})"
    sources = [*live, *(t.declared for t in addable)]
    undeclared = [name for name in needed if not any(name in source for source in sources)]
    if undeclared:
        listed = ", ".join(repr(name) for name in undeclared)
        return f"{where} has the resource{'s' if len(undeclared) > 1 else ''} {listed}"
    short = []
    for name, amount in needed.items():
        best = max((source.get(name, 0) for source in sources), default=0)
        if best < amount:
            holder = next((t.name for t in addable if t.declared.get(name, 0) == best), None)
            short.append(f"{name} {_quantity(name, amount)} asked, at most {_quantity(name, best)}"
                         + (f" (node type {holder!r})" if holder else ""))
    if short:
        return f"{where} has enough: " + "; ".join(short)
    declared = "; ".join(f"{t.name}: " + ", ".join(_amount(n, a) for n, a in t.resources) for t in addable)
    return f"{where} has all of it on one node (node types: {declared or 'none'})"


# -- waiting ------------------------------------------------------------------------------------------


@dataclass
class _Wait:
    scale_up: ScaleUp
    deadline: float
    done: Callable[[], bool]
    expire: Callable[[ScaleUpTimeout], None]
    needed: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.needed = dict(self.scale_up.needed)


class ScaleUpWatch:
    """Fails work whose node did not join in time; one thread per client, alive only while work waits.

    Every ``poll_s`` it lists the live nodes (``list_nodes``): a wait ends when its work is done or a
    live node holds its request (from then on the cluster's own queue decides, as for any busy
    cluster), and expires at its deadline, when ``expire`` gets the :class:`ScaleUpTimeout`.
    """

    def __init__(self, list_nodes: Callable[[], list[NodeResources]], *, poll_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._list_nodes = list_nodes
        self.poll_s = poll_s
        self._clock = clock
        self._waits: list[_Wait] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, scale_up: ScaleUp, *, done: Callable[[], bool], expire: Callable[[ScaleUpTimeout], None],
            deadline: float | None = None) -> None:
        """Watch one piece of work; ``deadline`` (this watch's clock) defaults to now plus its timeout."""
        wait = _Wait(scale_up, self._clock() + scale_up.timeout_s if deadline is None else deadline, done, expire)
        with self._lock:
            self._waits.append(wait)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fray-scale-up-watch", daemon=True)
                self._thread.start()

    def deadline(self, scale_up: ScaleUp) -> float:
        """The deadline for work of one call (a map's tasks share it)."""
        return self._clock() + scale_up.timeout_s

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waits)

    def _run(self) -> None:
        while True:
            time.sleep(self.poll_s)
            with self._lock:
                waits = [wait for wait in self._waits if not wait.done()]
                if not waits:
                    self._waits, self._thread = [], None
                    return
            try:
                nodes = self._list_nodes()
            except Exception:  # noqa: BLE001 - the cluster did not answer this time; deadlines still hold
                logger.debug("listing Ray nodes failed", exc_info=True)
                nodes = []
            now = self._clock()
            ended = [wait for wait in waits if any(holds(node, wait.needed) for node in nodes)]
            expired = [wait for wait in waits if wait not in ended and now >= wait.deadline]
            with self._lock:
                self._waits = [wait for wait in self._waits if wait not in ended and wait not in expired and not wait.done()]
            for wait in expired:
                error = wait.scale_up.timeout_error()
                logger.error("%s", error)
                try:
                    wait.expire(error)
                except Exception:  # noqa: BLE001 - one failing handle must not stop the others' deadlines
                    logger.exception("Could not fail %s after its scale-up deadline", wait.scale_up.what)
