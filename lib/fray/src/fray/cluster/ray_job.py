"""A job on a Ray node: a :class:`ProcessJob` inside a Ray actor that holds the job's resources.

The actor only forwards calls to the ``ProcessJob``, so a job behaves the same on Ray as locally.
What Ray adds is a way to lose the job: when the actor's worker or node dies (a preempted VM, a
node killed by hand), the handle reports ``LOST`` from then on instead of raising. A job whose
actor is lost before its process started (``start=False``, the node went away while the job waited
in ``free_address``: a spot VM taken back, which Ray may still count as alive for a few seconds) is
placed again, a few times, since nothing of it ran yet. On an autoscaling cluster a job can also
never be placed: :meth:`RayJob.expire` ends one whose node did not join in time, and the handle
then reports ``FAILED`` and raises that error where it would have waited for the job to start
(``free_address``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rigging.log import get_logger

from fray.cluster.client import JobRequest, JobStatus
from fray.cluster.process_job import ProcessJob

logger = get_logger(__name__)

# How many times a job not yet started is placed in all: its node may go away more than once.
_PLACEMENTS = 3
# The namespace of detached jobs' actors, so any driver of the cluster finds one by its job id.
DETACHED_NAMESPACE = "fray-jobs"
# How long a detached job's actor outlives the job's process, so that a last status call still answers.
_DETACHED_LINGER_S = 30.0


class _JobHost:
    """The actor: one ``ProcessJob`` on this node, addressed by the node's IP.

    A detached one (``lifetime="detached"``) outlives the driver that made it; it ends itself a
    little after its job's process ends, so the resources it holds go back to the cluster.
    """

    def __init__(self, request: JobRequest, job_id: str, start: bool, detached: bool = False) -> None:
        import ray

        self._job = ProcessJob(request, job_id, host=ray.util.get_node_ip_address(), start=start)
        if detached:
            threading.Thread(target=self._end_after_the_job, name=f"linger:{job_id}", daemon=True).start()

    def _end_after_the_job(self) -> None:
        while not self._job.wait(timeout=1.0).finished:
            pass
        time.sleep(_DETACHED_LINGER_S)
        os._exit(0)  # the actor's worker: Ray marks the actor dead and frees what it held

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self._job, method)(*args)


class RayJob:
    """The driver's handle of a job on a Ray node (see the module docstring).

    ``plan()`` runs before each placement (it raises to refuse one) and ``placed(job, planned)``
    after it, with what ``plan`` returned: the client's check and its scale-up deadline.
    """

    def __init__(self, ray: Any, request: JobRequest | None, job_id: str, options: dict[str, Any], *, start: bool,
                 plan: Callable[[], Any] = lambda: None,
                 placed: Callable[[RayJob, Any], None] = lambda job, planned: None, detached: bool = False,
                 actor: Any = None) -> None:
        self._ray = ray
        self.job_id = job_id
        self._request = request
        self._options = options
        self._plan = plan
        self._placed = placed
        self._started = start
        self._detached = detached
        self._final: tuple[JobStatus, int | None] | None = None
        self._released = False
        self.unplaced: BaseException | None = None  # why it was never placed (see expire)
        self.placements = 0
        if actor is not None:  # a job another driver placed (attach)
            self._actor = actor
            self.placements = 1
        else:
            self._place()

    @classmethod
    def attached(cls, ray: Any, job_id: str) -> RayJob:
        """The handle of a detached job another driver submitted: LOST when its actor is gone."""
        try:
            actor = ray.get_actor(job_id, namespace=DETACHED_NAMESPACE)
        except ValueError:  # no actor of that name: the job's actor ended (or never was)
            job = cls(ray, None, job_id, {}, start=True, actor=object())
            job._final = (JobStatus.LOST, None)
            return job
        return cls(ray, None, job_id, {}, start=True, actor=actor, detached=True)

    def locator(self) -> dict[str, str]:
        """What another driver needs to find a detached job again (:meth:`attached`)."""
        return {"backend": "ray", "namespace": DETACHED_NAMESPACE, "actor": self.job_id}

    def _place(self) -> None:
        planned = self._plan()
        options = dict(self._options)
        if self._detached:
            options.update(lifetime="detached", name=self.job_id, namespace=DETACHED_NAMESPACE)
        # Several threads, so status/logs/terminate answer while wait() blocks in another call.
        self._actor = self._ray.remote(max_concurrency=4, **options)(_JobHost).remote(
            self._request, self.job_id, self._started, self._detached)
        self._final = None
        self.placements += 1
        self._placed(self, planned)

    def _call(self, method: str, *args: Any, otherwise: Any = None) -> Any:
        """``method`` of the remote ``ProcessJob``; ``otherwise`` once the actor is gone."""
        if self._released or self.unplaced is not None or (self._final is not None and self._final[0] is JobStatus.LOST):
            return otherwise
        from ray.exceptions import RayActorError

        try:
            return self._ray.get(self._actor.call.remote(method, *args))
        except RayActorError as exc:
            if self.unplaced is not None:  # ended by expire() while this call waited for the actor
                return otherwise
            logger.warning("Job %s: lost its Ray actor (%s)", self.job_id, type(exc).__name__)
            self._final = (JobStatus.LOST, None)
            return otherwise

    def expire(self, error: BaseException) -> None:
        """End a job that was never placed (its node did not join in time): FAILED from now on, and
        ``free_address`` raises ``error``."""
        if self._final is not None:
            return
        self.unplaced = error
        self._final = (JobStatus.FAILED, None)
        try:
            self._ray.kill(self._actor)  # also withdraws its pending request from the autoscaler
        except Exception:  # noqa: BLE001 - already gone
            logger.debug("ray.kill failed", exc_info=True)

    @property
    def over(self) -> bool:
        """Whether the job ended or was released (a node joining no longer matters to it)."""
        return self._released or self._final is not None

    def _settle(self, status: JobStatus) -> JobStatus:
        # A finished job keeps its status and exit code, also after its actor is released.
        if status.finished and self._final is None:
            self._final = (status, self._call("exit_code"))
        return self._final[0] if self._final is not None else status

    def status(self) -> JobStatus:
        if self._final is not None:
            return self._final[0]
        return self._settle(self._call("status", otherwise=JobStatus.LOST))

    def wait(self, timeout: float | None = None) -> JobStatus:
        if self._final is not None:
            return self._final[0]
        return self._settle(self._call("wait", timeout, otherwise=JobStatus.LOST))

    def exit_code(self) -> int | None:
        return self._final[1] if self.status().finished else None

    def read_log(self, offset: int = 0) -> bytes:
        return self._call("read_log", offset, otherwise=b"")

    def logs(self) -> str:
        return self._call("logs", otherwise="")

    def free_address(self) -> str:
        while True:
            address = self._call("free_address")
            if self.unplaced is not None:
                raise self.unplaced
            if address is not None:
                return address
            if self._started or self._released or self.placements >= _PLACEMENTS:
                raise RuntimeError(f"Job {self.job_id} lost its Ray actor before it started "
                                   f"({self.placements} placement(s)).")
            logger.warning("Job %s: its node went away before the job started; placing it again", self.job_id)
            self._place()

    def start(self, env: Mapping[str, str] | None = None) -> None:
        self._started = True
        self._call("start", dict(env or {}))

    def terminate(self) -> None:
        self._call("terminate")

    def release(self) -> None:
        """Stop the job, then end the actor so its resources go back to the cluster."""
        if self._released:
            return
        self._call("release")
        self.status()  # STOPPED unless it had ended: kept from now on
        self._released = True
        try:
            self._ray.kill(self._actor)
        except Exception:  # noqa: BLE001 - already gone
            logger.debug("ray.kill failed", exc_info=True)
