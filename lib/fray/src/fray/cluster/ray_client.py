"""``RayClient``: remote functions as Ray tasks, actors as Ray actors, jobs as processes on Ray nodes.

``ray`` is imported on first use, so fray works without it installed (``pip install 'marin[ray]'``).

How a :class:`ResourceConfig` becomes Ray scheduling options:

* ``cpu`` -> ``num_cpus``; ``ram`` -> ``memory`` (bytes);
* GPU -> ``num_gpus=count``, and ``accelerator_type=variant`` unless the variant is ``"auto"``;
* TPU -> the custom resource ``TPU`` (chips on one host, from :mod:`fray.cluster.accelerators`) plus
  ``TPU-<type>-head`` so the work lands on the first host of a slice of that type (Ray's own TPU node
  labels, which spell v5e ``v5litepod``);
* ``custom`` -> Ray custom resources of the same names (``ray start --resources='{"trainer": 1}'``).

Before anything is submitted the request is checked against the nodes that are alive: if none
could ever hold it, :class:`UnschedulableError` says what was asked for and what the largest node
has, instead of a task that waits forever. On an autoscaling cluster whose nodes appear on demand
pass ``check_resources=False``.
"""

from __future__ import annotations

import concurrent.futures as cf
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from rigging.log import get_logger

from fray.cluster.client import ActorHandle, JobRequest, UnschedulableError, describe_request
from fray.cluster.pickling import apply_to_ray
from fray.cluster.ray_job import RayJob
from fray.cluster.resources import GpuDevice, ResourceConfig, TpuDevice
from fray.cluster.task_map import call_shipped, run_tasks, task_name

logger = get_logger(__name__)


def _ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("The Ray backend needs Ray: `pip install 'marin[ray]'` (or `pip install ray`).") from exc
    return ray


def ray_options(resources: ResourceConfig | None) -> dict[str, Any]:
    """Ray ``.options(...)`` for ``resources`` (``None``: one CPU)."""
    if resources is None:
        return {"num_cpus": 1}
    options: dict[str, Any] = {"num_cpus": resources.cpu, "memory": resources.ram_bytes}
    device = resources.device
    if isinstance(device, GpuDevice):
        options["num_gpus"] = device.count
        if device.variant != "auto":
            options["accelerator_type"] = device.variant
    elif isinstance(device, TpuDevice):
        # device.type is the TPU API's name ("v5litepod-16", never "v5e-16"), as Ray's labels spell it.
        options["resources"] = {"TPU": device.chips_per_host, f"TPU-{device.type}-head": 1}
    if resources.custom:
        options["resources"] = {**options.get("resources", {}), **dict(resources.custom)}
    return options


def _required(options: dict[str, Any]) -> dict[str, float]:
    """The node resources ``options`` consume, in the names ``ray.nodes()`` reports."""
    needed: dict[str, float] = {"CPU": float(options.get("num_cpus", 1))}
    if options.get("memory"):
        needed["memory"] = float(options["memory"])
    if options.get("num_gpus"):
        needed["GPU"] = float(options["num_gpus"])
    if options.get("accelerator_type"):
        needed[f"accelerator_type:{options['accelerator_type']}"] = 0.001
    for name, amount in options.get("resources", {}).items():
        needed[name] = float(amount)
    return needed


_BUILTIN = {"CPU", "GPU", "TPU", "memory", "object_store_memory"}
# Resources Ray adds by itself: a node's address, accelerator labels and TPU slice names.
_LABEL_PREFIXES = ("node:", "accelerator_type:", "TPU-")


def _custom_of(node: dict[str, float]) -> dict[str, float]:
    """A node's resources beyond CPUs, memory and accelerators: the ones ``ray start --resources`` declared."""
    return {name: amount for name, amount in node.items()
            if name not in _BUILTIN and not name.startswith(_LABEL_PREFIXES)}


def _describe_node(resources: dict[str, float]) -> str:
    cpus = resources.get("CPU", 0)
    memory = resources.get("memory", 0) / (1 << 30)
    text = f"{cpus:g} CPUs, {memory:.1f} GiB memory"
    if resources.get("GPU"):
        text += f", {resources['GPU']:g} GPUs"
    if resources.get("TPU"):
        text += f", {resources['TPU']:g} TPU chips"
    for name, amount in sorted(_custom_of(resources).items()):
        text += f", {name}: {amount:g}"
    return text


def _why_none_fits(needed: dict[str, float], nodes: list[dict[str, float]]) -> str:
    """What the live ``nodes`` lack for ``needed``, in words."""
    if not nodes:
        return "it has no live nodes"
    wanted = {name for name in needed if name not in _BUILTIN and not name.startswith(_LABEL_PREFIXES)}
    missing = sorted(name for name in wanted if not any(name in node for node in nodes))
    if missing:
        declared = sorted({name for node in nodes for name in _custom_of(node)})
        names = ", ".join(repr(name) for name in missing)
        return (f"none of its {len(nodes)} node(s) has the custom resource {names} (custom resources of its nodes: "
                f"{', '.join(declared) or 'none'}; a node declares them with `ray start --resources='{{\"{missing[0]}\": 1}}'`)")
    largest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("TPU", 0), n.get("CPU", 0), n.get("memory", 0)))
    return f"the largest of its {len(nodes)} node(s) has {_describe_node(largest)}"


def _user_error(error: BaseException) -> BaseException:
    """The task's own exception where Ray wrapped it (``RayTaskError`` subclasses it)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


class RayFuture(cf.Future):
    """A future for a Ray object; ``cancel()`` also cancels the Ray task."""

    def __init__(self, ref: Any) -> None:
        super().__init__()
        self.ref = ref
        ref.future().add_done_callback(self._copy)

    def _copy(self, source: cf.Future) -> None:
        if self.done():
            return
        try:
            error = source.exception()
        except cf.CancelledError as exc:
            error = exc
        try:
            if error is not None:
                self.set_exception(error)
            else:
                self.set_result(source.result())
        except cf.InvalidStateError:
            pass  # cancelled meanwhile

    def cancel(self) -> bool:
        if self.done():
            return False
        try:
            _ray().cancel(self.ref, force=True)
        except Exception:  # noqa: BLE001 - already finished or gone; the local state is what matters
            logger.debug("ray.cancel failed", exc_info=True)
        return super().cancel()


class RayClient:
    """Runs work on a Ray cluster.

    ``address``: ``"auto"`` (the cluster this machine belongs to), ``"ray://host:10001"`` (Ray
    client), or ``None`` to start a private local cluster. If Ray is already initialised in this
    process the existing connection is used. ``init_kwargs`` go to ``ray.init`` (for example a
    ``runtime_env`` that ships the project's code to remote nodes).
    """

    def __init__(self, address: str | None = "auto", *, check_resources: bool = True, task_retries: int = 2,
                 **init_kwargs: Any) -> None:
        self.address = address
        self.check_resources = check_resources
        self.task_retries = task_retries  # map's default max_retries: on a cluster nodes come and go
        self.init_kwargs = init_kwargs
        self._started_private_cluster = False

    def __repr__(self) -> str:
        return f"RayClient(address={self.address!r})"

    def _connect(self):
        ray = _ray()
        apply_to_ray()
        if not ray.is_initialized():
            logger.info("Connecting to Ray at %s", self.address or "a new local cluster")
            ray.init(address=self.address, **self.init_kwargs)
            self._started_private_cluster = self.address is None
        return ray

    # -- resources ---------------------------------------------------------------------------------

    def check_fits(self, resources: ResourceConfig | None, *, what: str = "this request") -> None:
        if not self.check_resources:
            return
        ray = self._connect()
        needed = _required(ray_options(resources))
        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        if any(all(node.get(name, 0) >= amount for name, amount in needed.items()) for node in nodes):
            return
        asked = describe_request(resources) if resources is not None else "1 CPU"
        raise UnschedulableError(
            f"{what} asks for {asked}, but no node of the Ray cluster can ever provide that: {_why_none_fits(needed, nodes)}. "
            "Ask for less (e.g. ResourceConfig.with_cpu(cpu=1)), or add a node that large; on an autoscaling "
            "cluster create the client with RayClient(check_resources=False)."
        )

    # -- remote functions and actors -------------------------------------------------------------

    def remote(self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> RayFuture:
        self.check_fits(resources, what=getattr(fn, "__name__", "a remote function"))
        ray = self._connect()
        task = ray.remote(**ray_options(resources))(fn)
        return RayFuture(task.remote(*args, **kwargs))

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *, resources: ResourceConfig | None = None,
            max_retries: int | None = None, on_result: Callable[[int, Any], None] | None = None) -> list:
        """Each item as a Ray task. ``fn`` goes into the object store once per call and is unpickled
        once per worker. A worker or node that dies is retried by Ray itself (up to 3 times, silently)
        before it counts against ``max_retries``."""
        items = list(items)
        if not items:
            return []
        name = task_name(fn)
        self.check_fits(resources, what=name)
        ray = self._connect()
        key, shipped = uuid.uuid4().hex, ray.put(cloudpickle.dumps(fn))
        task = ray.remote(**ray_options(resources))(call_shipped)
        return run_tasks(lambda index: RayFuture(task.remote(key, shipped, items[index])), len(items), name=name,
                         max_retries=self.task_retries if max_retries is None else max_retries, on_result=on_result,
                         explain=lambda index, error: _user_error(error))

    def create_actor(self, cls: type, *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> ActorHandle:
        name = getattr(cls, "__name__", "actor")
        self.check_fits(resources, what=f"actor {name}")
        ray = self._connect()
        actor = ray.remote(**ray_options(resources))(cls).remote(*args, **kwargs)

        def send(method: str, call_args: tuple, call_kwargs: dict) -> cf.Future:
            return RayFuture(getattr(actor, method).remote(*call_args, **call_kwargs))

        def stop() -> None:
            ray.kill(actor)

        return ActorHandle(name, send, stop)

    # -- jobs --------------------------------------------------------------------------------------

    def submit(self, request: JobRequest, *, start: bool = True) -> RayJob:
        """A process inside a Ray actor that holds ``request.resources`` (see :mod:`fray.cluster.ray_job`)."""
        self.check_fits(request.resources, what=f"job {request.name!r}")
        job_id = f"{request.name}-{uuid.uuid4().hex[:8]}"
        return RayJob(self._connect(), request, job_id, ray_options(request.resources), start=start)

    def shutdown(self) -> None:
        """Ends the private cluster this client started (``address=None``); leaves any other Ray connection
        as it is: other code in this process may still use it."""
        if self._started_private_cluster:
            self._started_private_cluster = False
            _ray().shutdown()
