"""One job as one child process: a command, or a cloudpickled callable run by ``fray.cluster.job_worker``.

This is the only code in the project that starts a job's process; both clients use it. The local
client runs it in the driver (its handle *is* a ``ProcessJob``), the Ray client inside an actor
that holds the job's resources on the chosen node. So what "start, read the output, stop" mean is
the same everywhere:

* the process gets a session of its own, so ``terminate`` (SIGTERM, SIGKILL after a grace period)
  reaches whatever it started too: a shell's children, a launcher's workers;
* its stdout and stderr go to one log file, read by offset while it runs and after it ends;
* a command that cannot be started is a FAILED job with exit code 127 (the shell's "command not
  found") and the reason in its log, not an exception on a machine the caller may not be on.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping

import cloudpickle

from fray.cluster.client import JobRequest, JobStatus, read_whole_log

LOOPBACK = "127.0.0.1"
CANNOT_START_EXIT_CODE = 127
READ_LIMIT = 4 << 20


class ProcessJob:
    """``request`` as a child process of this one; see the module docstring.

    ``host`` is this machine's address as the job's peers reach it (loopback when they all run
    here). With ``start=False`` nothing runs until :meth:`start`.
    """

    def __init__(self, request: JobRequest, job_id: str, *, host: str = LOOPBACK, start: bool = True) -> None:
        self.job_id = job_id
        self.request = request
        self.host = host
        self._folder = tempfile.mkdtemp(prefix="fray-job-")
        self._log_path = os.path.join(self._folder, "output.log")
        open(self._log_path, "wb").close()
        if request.is_command:
            self._command = list(request.entrypoint)
        else:
            payload = os.path.join(self._folder, "payload.pkl")
            with open(payload, "wb") as handle:
                cloudpickle.dump((request.entrypoint, tuple(request.args), dict(request.kwargs)), handle)
            self._command = [sys.executable, "-m", "fray.cluster.job_worker", payload]
        self._process: subprocess.Popen | None = None
        self._could_not_start = False
        self._stopped = False
        self._released = False
        if start:
            self.start()

    def free_address(self) -> str:
        # The port is probed on ``host`` only, so the probe never listens wider than the server will.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((self.host, 0))
            return f"{self.host}:{sock.getsockname()[1]}"

    def start(self, env: Mapping[str, str] | None = None) -> None:
        if self._process is not None or self._could_not_start or self._released:
            raise RuntimeError(f"Job {self.job_id} was already started.")
        full_env = {
            **os.environ,
            **{str(k): str(v) for k, v in {**self.request.env, **(env or {})}.items()},
            "FRAY_JOB_ID": self.job_id,
            "PYTHONUNBUFFERED": "1",
        }
        cwd = self.request.cwd if self.request.cwd and os.path.isdir(self.request.cwd) else None
        with open(self._log_path, "ab") as log:
            try:
                self._process = subprocess.Popen(
                    self._command, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True
                )
            except OSError as exc:
                log.write(f"fray: job {self.request.name!r} could not start {self._command[0]!r}: {exc}\n".encode())
                self._could_not_start = True

    def exit_code(self) -> int | None:
        if self._could_not_start:
            return CANNOT_START_EXIT_CODE
        return None if self._process is None else self._process.poll()

    def status(self) -> JobStatus:
        code = self.exit_code()
        if code is None and self._process is None:
            return JobStatus.STOPPED if self._released else JobStatus.PENDING
        if code is None:
            return JobStatus.RUNNING
        if self._stopped:
            return JobStatus.STOPPED
        return JobStatus.SUCCEEDED if code == 0 else JobStatus.FAILED

    def wait(self, timeout: float | None = None) -> JobStatus:
        if self._process is not None:
            try:
                self._process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.status()

    def read_log(self, offset: int = 0, limit: int = READ_LIMIT) -> bytes:
        if self._released:
            return b""
        with open(self._log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read(limit)

    def logs(self) -> str:
        return read_whole_log(self.read_log)

    def terminate(self, grace_s: float = 5.0) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._stopped = True
        self._signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self._process.wait()

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self._process.pid, signum)
        except ProcessLookupError:
            pass

    def release(self) -> None:
        self.terminate()
        if not self._released:
            self._released = True
            shutil.rmtree(self._folder, ignore_errors=True)
