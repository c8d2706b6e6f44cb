"""Where replicas run: ``local`` (child processes of the supervisor) or ``ray`` (a Ray actor per replica).

A backend places one replica and returns a :class:`Replica` to start; the supervisor only polls, copies
logs and terminates, so the retry and all-or-nothing logic is the same on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rigging.log import get_logger

from iris.process import CommandProcess
from iris.spec import PREEMPTED_EXIT_CODE, JobSpec

logger = get_logger(__name__)

LOOPBACK = "127.0.0.1"


class Replica(Protocol):
    def coordinator_address(self) -> str:
        """A free ``HOST:PORT`` on this replica's machine (asked of replica 0 before any replica starts)."""
        ...

    def coordinator_bind_address(self, coordinator: str) -> str | None:
        """Where replica 0's coordinator should listen, or ``None`` for JAX's default (every interface)."""
        ...

    def start(self, env: dict[str, str]) -> None: ...

    def poll(self) -> int | None: ...

    def sync_logs(self) -> None:
        """Bring the replica's output so far into its log file beside the job database."""
        ...

    def terminate(self) -> int | None: ...

    def release(self) -> None:
        """Free what holds the replica once it has exited (a Ray actor and its resources)."""
        ...


class LocalReplica:
    def __init__(self, command: list[str], log_path: Path, cwd: str | None) -> None:
        self._process = CommandProcess()
        self._command, self._log_path, self._cwd = command, log_path, cwd

    def coordinator_address(self) -> str:
        # Every replica is a child of this supervisor, on this machine.
        return self._process.coordinator_address(LOOPBACK)

    def coordinator_bind_address(self, coordinator: str) -> str | None:
        # Nothing off this machine needs to reach the coordinator, so nothing off it should be able to.
        return coordinator

    def start(self, env: dict[str, str]) -> None:
        self._process.start(self._command, env, str(self._log_path), self._cwd)

    def poll(self) -> int | None:
        return self._process.poll()

    def sync_logs(self) -> None:
        pass  # the process writes straight into the job's log file

    def terminate(self) -> int | None:
        return self._process.stop()

    def release(self) -> None:
        pass


def _actor_lost_errors() -> tuple[type[BaseException], ...]:
    from ray.exceptions import RayActorError

    return (RayActorError,)


class RayReplica:
    """A replica as a ``CommandProcess`` inside a Ray actor that holds the replica's resources."""

    def __init__(self, client, spec: JobSpec, command: list[str], log_path: Path, cwd: str | None) -> None:
        self._actor = client.create_actor(CommandProcess, resources=spec.resources)
        self._command, self._cwd = command, cwd
        self._log_path = log_path
        self._offset = 0
        self._exit_code: int | None = None
        self._gone = False

    def coordinator_address(self) -> str:
        return self._actor.coordinator_address.remote().result()

    def coordinator_bind_address(self, coordinator: str) -> str | None:
        # Replicas on other nodes connect to it; JAX's default listens wherever they may come from.
        return None

    def start(self, env: dict[str, str]) -> None:
        self._actor.start.remote(self._command, env, None, self._cwd).result()

    def poll(self) -> int | None:
        if self._exit_code is None:
            try:
                self._exit_code = self._actor.poll.remote().result()
            except _actor_lost_errors() as exc:  # the actor's node is gone: the replica was preempted
                self._lost(exc)
        return self._exit_code

    def _lost(self, error: Exception) -> None:
        logger.warning("Lost the Ray actor of a replica: %s", error)
        with open(self._log_path, "ab") as handle:
            handle.write(f"\niris: lost this replica's Ray actor ({type(error).__name__}); counted as preempted\n".encode())
        self._exit_code = PREEMPTED_EXIT_CODE
        self._gone = True

    def sync_logs(self) -> None:
        while not self._gone:
            try:
                chunk = self._actor.read_log.remote(self._offset).result()
            except _actor_lost_errors() as exc:
                self._lost(exc)
                return
            if not chunk:
                return
            with open(self._log_path, "ab") as handle:
                handle.write(chunk)
            self._offset += len(chunk)

    def terminate(self) -> int | None:
        if self._gone:
            return self._exit_code
        try:
            code = self._actor.stop.remote().result()
        except _actor_lost_errors() as exc:
            self._lost(exc)
            return self._exit_code
        self.sync_logs()
        self.release()
        return code

    def release(self) -> None:
        """End the actor (after its process has exited), so its resources go back to the cluster."""
        if not self._gone:
            self._gone = True
            try:
                self._actor.terminate()
            except Exception:  # noqa: BLE001 - already gone
                logger.debug("ray.kill failed", exc_info=True)


class Backend:
    """Starts replicas of one job; ``close`` releases what the backend holds (a Ray connection)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self._ray_client = None
        if spec.backend == "ray":
            from fray.cluster.ray_client import RayClient

            # address None: a private local cluster for this job, sized to the replicas it runs.
            init_kwargs = {"include_dashboard": False, "log_to_driver": False}
            if spec.ray_address is None:
                init_kwargs["num_cpus"] = max(1, int(spec.resources.cpu * spec.replicas + 0.999))
            self._ray_client = RayClient(spec.ray_address, **init_kwargs)
            self._ray_client.check_fits(spec.resources, what=f"job {spec.name!r}")

    def create(self, log_path: Path) -> Replica:
        """A replica placed (and, on Ray, holding its resources) but not started yet."""
        command = list(self.spec.command)
        if self._ray_client is not None:
            return RayReplica(self._ray_client, self.spec, command, log_path, self.spec.cwd)
        return LocalReplica(command, log_path, self.spec.cwd)

    def close(self) -> None:
        if self._ray_client is not None and self.spec.ray_address is None:
            import ray

            ray.shutdown()
