"""One replica's command as a child process in its own process group, output to a log file.

The same class runs in the supervisor (local backend) and inside a Ray actor on the chosen node
(Ray backend), so "start, poll, read output, stop" mean the same thing on both.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile


class CommandProcess:
    """One replica's process: ``start`` it, ``poll`` for its exit code, ``read_log`` its output, ``stop`` it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._start_error = False
        self.log_path: str | None = None

    def coordinator_address(self, host: str | None = None) -> str:
        """``HOST:PORT``, free now, for the job's ``jax.distributed`` coordinator.

        ``host`` defaults to this machine's address as the cluster sees it; the port is probed on
        that address only, so the probe itself never listens more widely than the coordinator will.
        """
        host = host or _node_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return f"{host}:{sock.getsockname()[1]}"

    def start(self, command: list[str], env: dict[str, str], log_path: str | None = None, cwd: str | None = None) -> None:
        if log_path is None:
            handle, log_path = tempfile.mkstemp(prefix="iris-replica-", suffix=".log")
            os.close(handle)
        self.log_path = log_path
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        if cwd is not None and not os.path.isdir(cwd):
            cwd = None  # a remote node without the submitter's folder: run in the worker's own
        with open(log_path, "ab") as log:
            try:
                # A session of its own, so stopping the replica also stops whatever it started
                # (a shell's children, a launcher's workers).
                self._process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True
                )
            except OSError as exc:
                log.write(f"iris: could not start {command[0]!r}: {exc}\n".encode())
                self._start_error = True

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or ``None`` while it runs."""
        if self._start_error:
            return 127  # the shell's "command not found"
        return None if self._process is None else self._process.poll()

    def read_log(self, offset: int, limit: int = 1 << 20) -> bytes:
        if self.log_path is None:
            return b""
        with open(self.log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read(limit)

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM the replica's process group, SIGKILL after ``grace_s``; returns the exit code."""
        if self._process is None or self._process.poll() is not None:
            return self.poll()
        self._signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self._process.wait()
        return self._process.poll()

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self._process.pid, signum)
        except ProcessLookupError:
            pass


def _node_address() -> str:
    """This machine's address as the cluster sees it: Ray's node IP inside Ray, else loopback."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"
