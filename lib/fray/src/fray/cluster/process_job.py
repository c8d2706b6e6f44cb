"""One job as one child process: a command, or a cloudpickled callable run by ``fray.cluster.job_worker``.

Both backends use this: the local client runs it in the driver, the Ray client inside an actor on
the chosen node. Output goes to a log file next to the payload so ``logs()`` works while the job
runs and after it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading

import cloudpickle

from fray.cluster.client import JobRequest, JobStatus


class ProcessJob:
    """Start ``request`` now in a child process; ``status``/``wait``/``logs``/``terminate`` it."""

    def __init__(self, request: JobRequest, job_id: str) -> None:
        self.job_id = job_id
        self.request = request
        self._folder = tempfile.mkdtemp(prefix=f"fray-job-{job_id}-")
        self._log_path = os.path.join(self._folder, "output.log")
        self._stopped = threading.Event()
        if request.is_command:
            command = list(request.entrypoint)
        else:
            payload = os.path.join(self._folder, "payload.pkl")
            with open(payload, "wb") as handle:
                cloudpickle.dump((request.entrypoint, tuple(request.args), dict(request.kwargs)), handle)
            command = [sys.executable, "-m", "fray.cluster.job_worker", payload]
        env = {**os.environ, **{str(k): str(v) for k, v in request.env.items()}, "FRAY_JOB_ID": job_id, "PYTHONUNBUFFERED": "1"}
        with open(self._log_path, "wb") as log:
            try:
                self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            except OSError as exc:
                raise FileNotFoundError(f"Job {request.name!r} could not start {command[0]!r}: {exc}") from exc

    def status(self) -> JobStatus:
        code = self._process.poll()
        if code is None:
            return JobStatus.RUNNING
        if self._stopped.is_set():
            return JobStatus.STOPPED
        return JobStatus.SUCCEEDED if code == 0 else JobStatus.FAILED

    def wait(self, timeout: float | None = None) -> JobStatus:
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.status()

    def logs(self) -> str:
        with open(self._log_path, "rb") as handle:
            return handle.read().decode("utf-8", errors="replace")

    def terminate(self, grace_s: float = 5.0) -> None:
        if self._process.poll() is not None:
            return
        self._stopped.set()
        self._process.terminate()
        try:
            self._process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    @property
    def exit_code(self) -> int | None:
        return self._process.poll()
