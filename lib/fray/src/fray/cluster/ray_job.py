"""A job on a Ray node: a :class:`ProcessJob` inside a Ray actor that holds the job's resources.

The actor only forwards calls to the ``ProcessJob``, so a job behaves the same on Ray as locally.
What Ray adds is a way to lose the job: when the actor's worker or node dies (a preempted VM, a
node killed by hand), the handle reports ``LOST`` from then on instead of raising.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rigging.log import get_logger

from fray.cluster.client import JobRequest, JobStatus
from fray.cluster.process_job import ProcessJob

logger = get_logger(__name__)


class _JobHost:
    """The actor: one ``ProcessJob`` on this node, addressed by the node's IP."""

    def __init__(self, request: JobRequest, job_id: str, start: bool) -> None:
        import ray

        self._job = ProcessJob(request, job_id, host=ray.util.get_node_ip_address(), start=start)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self._job, method)(*args)


class RayJob:
    """The driver's handle of a job on a Ray node (see the module docstring)."""

    def __init__(self, ray: Any, request: JobRequest, job_id: str, options: dict[str, Any], *, start: bool) -> None:
        self._ray = ray
        self.job_id = job_id
        # Several threads, so status/logs/terminate answer while wait() blocks in another call.
        self._actor = ray.remote(max_concurrency=4, **options)(_JobHost).remote(request, job_id, start)
        self._final: tuple[JobStatus, int | None] | None = None
        self._released = False

    def _call(self, method: str, *args: Any, otherwise: Any = None) -> Any:
        """``method`` of the remote ``ProcessJob``; ``otherwise`` once the actor is gone."""
        if self._released or (self._final is not None and self._final[0] is JobStatus.LOST):
            return otherwise
        from ray.exceptions import RayActorError

        try:
            return self._ray.get(self._actor.call.remote(method, *args))
        except RayActorError as exc:
            logger.warning("Job %s: lost its Ray actor (%s)", self.job_id, type(exc).__name__)
            self._final = (JobStatus.LOST, None)
            return otherwise

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
        address = self._call("free_address")
        if address is None:
            raise RuntimeError(f"Job {self.job_id} lost its Ray actor before it started.")
        return address

    def start(self, env: Mapping[str, str] | None = None) -> None:
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
