"""``RayClient``: remote functions as Ray tasks, actors as Ray actors, jobs as processes on Ray nodes.

``ray`` is imported on first use, so fray works without it installed (``pip install 'marin[ray]'``).

How a :class:`ResourceConfig` becomes Ray scheduling options:

* ``cpu`` -> ``num_cpus``; ``ram`` -> ``memory`` (bytes);
* GPU -> ``num_gpus=count``, and ``accelerator_type=variant`` unless the variant is ``"auto"``;
* TPU -> the custom resource ``TPU`` (chips on one host, from :mod:`fray.cluster.accelerators`) plus
  ``TPU-<type>-head`` so the work lands on the first host of a slice of that type (Ray's own TPU node
  labels, which spell v5e ``v5litepod``);
* ``custom`` -> Ray custom resources of the same names (``ray start --resources='{"trainer": 1}'``).

Before anything is submitted the request is checked against the nodes that are alive. If none
can hold it, the cluster's autoscaler decides (:mod:`fray.cluster.ray_autoscaler`): when one of its
node types can, the work is submitted and waits for the node, logging one line that names the
resource, the worker group and the deadline (``ResourceConfig.scale_up_timeout_s``), past which it
fails with :class:`ScaleUpTimeout`; otherwise, or on a cluster without an autoscaler,
:class:`UnschedulableError` says at once what was asked for and what is missing, instead of a task
that waits forever. ``check_resources=False`` skips all of this.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from rigging.log import get_logger

from fray.cluster.client import ActorHandle, JobRequest, UnschedulableError, describe_request
from fray.cluster.pickling import apply_to_ray
from fray.cluster.ray_autoscaler import Autoscaler, ScaleUp, ScaleUpWatch, find_autoscaler, holds, plan_scale_up
from fray.cluster.ray_job import RayJob
from fray.cluster.resources import DEFAULT_SCALE_UP_TIMEOUT_S, GpuDevice, ResourceConfig, TpuDevice
from fray.cluster.task_map import call_shipped, run_tasks, task_name
from fray.errors import FrayError

logger = get_logger(__name__)

# A request waiting for the same node is announced once in this long (the checks before a job and
# its submission would otherwise say it twice).
_ANNOUNCE_EVERY_S = 60.0


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


def plan_placement(resources: ResourceConfig | None, live: list[dict[str, float]], autoscaler: Autoscaler, *,
                   what: str = "this request") -> ScaleUp | None:
    """What ``resources`` waits for on a cluster whose live nodes have ``live`` and whose autoscaler is
    ``autoscaler``: ``None`` (a live node holds it), the :class:`ScaleUp` it waits for, or
    :class:`UnschedulableError`. The check :class:`RayClient` makes before submitting, which also
    runs offline on a cluster file's node types (``autoscaler_from_config``)."""
    asked = describe_request(resources) if resources is not None else "1 CPU"
    timeout_s = resources.scale_up_timeout_s if resources is not None else DEFAULT_SCALE_UP_TIMEOUT_S
    return plan_scale_up(_required(ray_options(resources)), live, autoscaler, what=what, asked=asked, timeout_s=timeout_s)


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

    def fail(self, error: BaseException) -> None:
        """End the future with ``error`` and withdraw its task (its node never joined)."""
        try:
            self.set_exception(error)
        except cf.InvalidStateError:
            return  # it finished meanwhile
        try:
            _ray().cancel(self.ref, force=True)
        except Exception:  # noqa: BLE001 - already gone
            logger.debug("ray.cancel failed", exc_info=True)


class RayUnavailableError(FrayError, ConnectionError):
    """No Ray cluster answers at the client's address."""


class RayClient:
    """Runs work on a Ray cluster.

    ``address``: ``"auto"`` (the cluster this machine belongs to), ``"ray://host:10001"`` (Ray
    client), or ``None`` to start a private local cluster. If Ray is already initialised in this
    process the existing connection is used. ``init_kwargs`` go to ``ray.init`` (for example a
    ``runtime_env`` that ships the project's code to remote nodes).

    ``autoscaling``: ``None`` asks the cluster whether an autoscaler runs and which node types it
    can add (see the module docstring); ``True`` (the ``ray:autoscaling`` setting) also waits when
    the node types cannot be read from here; ``False`` refuses whatever no live node can hold.
    """

    def __init__(self, address: str | None = "auto", *, check_resources: bool = True, autoscaling: bool | None = None,
                 task_retries: int = 2, **init_kwargs: Any) -> None:
        self.address = address
        self.check_resources = check_resources
        self.autoscaling = autoscaling
        self.task_retries = task_retries  # map's default max_retries: on a cluster nodes come and go
        self.init_kwargs = init_kwargs
        self._started_private_cluster = False
        self._lock = threading.Lock()
        self._autoscaler: Autoscaler | None | bool = False  # False: not looked up yet; None: it has none
        self._announced: dict[tuple, float] = {}
        self._watch = ScaleUpWatch(self._live_node_resources)

    def __repr__(self) -> str:
        return f"RayClient(address={self.address!r})"

    # What belongs to this process only: a client shipped to another one (inside a step's function,
    # as a tokenizer's shard backend) takes its settings and starts these afresh.
    _PROCESS_STATE = ("_started_private_cluster", "_lock", "_autoscaler", "_announced", "_watch")

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name not in self._PROCESS_STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._started_private_cluster = False
        self._lock = threading.Lock()
        self._autoscaler = False
        self._announced = {}
        self._watch = ScaleUpWatch(self._live_node_resources)

    def _connect(self):
        ray = _ray()
        apply_to_ray()
        if not ray.is_initialized():
            logger.info("Connecting to Ray at %s", self.address or "a new local cluster")
            try:
                ray.init(address=self.address, **self.init_kwargs)
            except ConnectionError as error:
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise RayUnavailableError(
                    f"No Ray cluster answers at {self.address!r}: {reason} Start one "
                    "(`ray start --head`), or point RAY_ADDRESS (or the setting, ray://HOST:10001) at yours."
                ) from error
            self._started_private_cluster = self.address is None
        return ray

    # -- resources ---------------------------------------------------------------------------------

    def check_fits(self, resources: ResourceConfig | None, *, what: str = "this request") -> None:
        """Raise :class:`UnschedulableError` if no node can ever hold ``resources``; on an autoscaling
        cluster, log the one line saying which node the work will wait for, and for how long."""
        self._plan(resources, what)

    def _plan(self, resources: ResourceConfig | None, what: str) -> ScaleUp | None:
        """``None`` when a live node holds ``resources`` (or checks are off), the :class:`ScaleUp` the
        work waits for, or :class:`UnschedulableError`."""
        if not self.check_resources:
            return None
        ray = self._connect()
        needed = _required(ray_options(resources))
        nodes = self._live_node_resources()
        if any(holds(node, needed) for node in nodes):
            return None
        asked = describe_request(resources) if resources is not None else "1 CPU"
        autoscaler = self._find_autoscaler(ray)
        if autoscaler is None:
            raise UnschedulableError(
                f"{what} asks for {asked}, but no node of the Ray cluster can ever provide that: "
                f"{_why_none_fits(needed, nodes)}. Ask for less (e.g. ResourceConfig.with_cpu(cpu=1)), or add a node "
                "that large; the cluster runs no autoscaler that could add one (a `ray up` cluster does)."
            )
        scale_up = plan_placement(resources, nodes, autoscaler, what=what)
        if scale_up is not None:
            self._announce(scale_up)
        return scale_up

    def _live_node_resources(self) -> list[dict[str, float]]:
        return [node.get("Resources", {}) for node in _ray().nodes() if node.get("Alive")]

    def _find_autoscaler(self, ray: Any) -> Autoscaler | None:
        """The cluster's autoscaler (looked up once per client), as ``autoscaling`` allows."""
        if self.autoscaling is False or self._started_private_cluster:
            return None
        with self._lock:
            if self._autoscaler is False:
                found = find_autoscaler(ray, remote_driver=str(self.address or "").startswith("ray://"))
                if found is not None and found.node_types is not None:
                    logger.info("The Ray cluster's autoscaler can add: %s (from %s)",
                                ", ".join(t.name for t in found.addable()) or "no worker groups", found.source)
                self._autoscaler = found
            found = self._autoscaler
        if found is not None and found.node_types is None and not self.autoscaling:
            return None  # it may autoscale, but nothing says so: refuse rather than wait on a guess
        return found

    def _announce(self, scale_up: ScaleUp) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._announced.get(scale_up.needed)
            if last is not None and now - last < _ANNOUNCE_EVERY_S:
                return
            self._announced[scale_up.needed] = now
        logger.info("%s", scale_up.waiting_line())

    # -- remote functions and actors -------------------------------------------------------------

    def remote(self, fn: Callable[..., Any], *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> RayFuture:
        scale_up = self._plan(resources, what=getattr(fn, "__name__", "a remote function"))
        ray = self._connect()
        task = ray.remote(**ray_options(resources))(fn)
        future = RayFuture(task.remote(*args, **kwargs))
        if scale_up is not None:
            self._watch.add(scale_up, done=future.done, expire=future.fail)
        return future

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *, resources: ResourceConfig | None = None,
            max_retries: int | None = None, on_result: Callable[[int, Any], None] | None = None) -> list:
        """Each item as a Ray task. ``fn`` goes into the object store once per call and is unpickled
        once per worker. A worker or node that dies is retried by Ray itself (up to 3 times, silently)
        before it counts against ``max_retries``."""
        items = list(items)
        if not items:
            return []
        name = task_name(fn)
        scale_up = self._plan(resources, what=name)
        ray = self._connect()
        key, shipped = uuid.uuid4().hex, ray.put(cloudpickle.dumps(fn))
        task = ray.remote(**ray_options(resources))(call_shipped)
        deadline = self._watch.deadline(scale_up) if scale_up is not None else None  # one for the whole call

        def submit(index: int) -> RayFuture:
            future = RayFuture(task.remote(key, shipped, items[index]))
            if scale_up is not None:
                self._watch.add(scale_up, done=future.done, expire=future.fail, deadline=deadline)
            return future

        return run_tasks(submit, len(items), name=name,
                         max_retries=self.task_retries if max_retries is None else max_retries, on_result=on_result,
                         explain=lambda index, error: _user_error(error))

    def create_actor(self, cls: type, *args: Any, resources: ResourceConfig | None = None, **kwargs: Any) -> ActorHandle:
        name = getattr(cls, "__name__", "actor")
        scale_up = self._plan(resources, what=f"actor {name}")
        ray = self._connect()
        actor = ray.remote(**ray_options(resources))(cls).remote(*args, **kwargs)
        state: dict[str, Any] = {"unplaced": None, "stopped": False}

        def send(method: str, call_args: tuple, call_kwargs: dict) -> cf.Future:
            if state["unplaced"] is not None:  # its node never joined: every call says why
                failed: cf.Future = cf.Future()
                failed.set_exception(state["unplaced"])
                return failed
            return RayFuture(getattr(actor, method).remote(*call_args, **call_kwargs))

        def stop() -> None:
            state["stopped"] = True
            ray.kill(actor)

        def expire(error: BaseException) -> None:
            state["unplaced"] = error
            ray.kill(actor)

        if scale_up is not None:
            self._watch.add(scale_up, done=lambda: state["stopped"], expire=expire)
        return ActorHandle(name, send, stop)

    # -- jobs --------------------------------------------------------------------------------------

    def submit(self, request: JobRequest, *, start: bool = True, detached: bool = False) -> RayJob:
        """A process inside a Ray actor that holds ``request.resources`` (see :mod:`fray.cluster.ray_job`).

        ``detached``: the actor outlives this driver (Ray's ``lifetime="detached"``), runs on this
        driver's node, and is found again by :meth:`attach` from any driver of the cluster.
        """
        what = f"job {request.name!r}"
        job_id = f"{request.name}-{uuid.uuid4().hex[:8]}"
        ray = self._connect()
        options = ray_options(request.resources)
        if detached:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        # Checked again at each placement: a job whose node went away before it started is placed anew.
        return RayJob(ray, request, job_id, options, start=start, plan=lambda: self._plan(request.resources, what),
                      placed=self._watch_job, detached=detached)

    def gcs_address(self) -> str:
        """``HOST:PORT`` of the cluster's GCS as this driver reached it: what another process sets as
        ``RAY_ADDRESS`` to join the same cluster the same way."""
        return self._connect().get_runtime_context().gcs_address

    def attach(self, locator: dict[str, str]) -> RayJob:
        """The handle of a detached job, from its :meth:`RayJob.locator` (LOST once its actor is gone)."""
        return RayJob.attached(self._connect(), str(locator["actor"]))

    def _watch_job(self, job: RayJob, scale_up: ScaleUp | None) -> None:
        if scale_up is not None:
            placement = job.placements  # a later placement has a deadline of its own
            self._watch.add(scale_up, done=lambda: job.over or job.placements != placement, expire=job.expire)

    def shutdown(self) -> None:
        """Ends the private cluster this client started (``address=None``); leaves any other Ray connection
        as it is: other code in this process may still use it."""
        if self._started_private_cluster:
            self._started_private_cluster = False
            _ray().shutdown()
