"""The node side of a Slurm job: ``python -I slurm_worker.py JOB_FOLDER`` is the batch script's one command.

It runs on the compute node, inside the allocation, and talks to the client only through files
in the job folder (storage both machines see):

* ``request.json`` (written by the client): the command, its environment, working directory,
  and whether to wait for ``start``;
* ``address`` (written here, first thing): ``HOST:PORT``, a port free on this node now; its
  presence tells the client the allocation is held;
* ``start.json`` (written by the client's ``start(env)``): awaited before the command runs when
  the job was submitted with ``start=False``, at most ``start_timeout_s`` of the request (then the
  job ends without running the command: its submitter is gone); its variables add to the request's;
* ``request-secrets.json``, ``start-secrets.json``: the secret variables (``rigging.secrets``) of
  the request and of ``start(env)``, kept out of the two files above. Only the owner can read them
  (the folder is on shared storage), and this script deletes each as soon as it has read it, so
  credentials sit on that storage for moments, not for the job's life;
* ``exit_code`` (written here, last thing): the command's own exit status, negative when a
  signal killed it (Slurm's own record cannot tell 75 from a crash once accounting is off).

The command's output goes where Slurm sends this script's (``output.log`` of the folder). The
command runs in a session of its own; SIGTERM (and SIGINT, SIGUSR1, SIGUSR2) that reach this
script are forwarded to the command's whole process group and this script keeps waiting, so the
command decides how to end: ``scancel --batch --signal=TERM JOB`` (which signals only the batch
script), the warning ``sbatch --signal=B:TERM@N`` sends before a time limit, and a cancel or
preemption all reach it, and its exit code is still recorded. When Slurm itself ends the job
(``scancel JOB``, a time limit, a preemption) it signals every process of the job, so the command
hears SIGTERM twice, from Slurm and forwarded; ``SlurmJob.terminate`` avoids that by signalling
only this script first.

Standard library only, run by path with ``-I``: it starts in a fraction of the time importing the
package would take, and nothing on the node's ``PYTHONPATH`` can shadow what it uses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

CANNOT_START_EXIT_CODE = 127
START_POLL_S = 0.1
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def write_atomically(path: str, text: str, *, private: bool = False) -> None:
    """Write ``text`` to ``path`` so a reader on another machine sees all of it or nothing;
    ``private``: readable by the owner only, from the moment the file exists."""
    staging = f"{path}.{os.getpid()}.tmp"
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, path)


def node_address() -> str:
    """``HOST:PORT``: this node's address as other nodes reach it, and a port free on it now."""
    host = socket.gethostbyname(socket.gethostname())
    if host.startswith("127."):  # a hosts file that maps the node's name to loopback (Debian's 127.0.1.1)
        host = _address_towards(os.environ.get("SLURM_SUBMIT_HOST", "")) or host
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"


def _address_towards(peer: str) -> str | None:
    """This node's address on the route to ``peer`` (no packet is sent: a UDP socket only picks a route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer, 9))
            return probe.getsockname()[0]
    except OSError:
        return None


class Forwarder:
    """Signals that reach this script go to the command's process group once it runs."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.received: list[int] = []
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self.handle)

    def handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass


def wait_for_start(folder: str, forwarder: Forwarder, timeout_s: float | None = None) -> dict[str, str] | None:
    """The variables of ``start.json`` once it appears; ``None`` when a signal or ``timeout_s`` ended the wait."""
    path = os.path.join(folder, "start.json")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not os.path.exists(path):
        if forwarder.received:
            return None
        if deadline is not None and time.monotonic() >= deadline:
            print(f"fray: job {os.path.basename(folder)!r} was not started within {timeout_s:g} s of holding its "
                  "allocation (its submitter is gone); it ends without running its command", flush=True)
            return None
        time.sleep(START_POLL_S)
    with open(path) as handle:
        return json.load(handle)


def take_secrets(folder: str, name: str) -> dict[str, str]:
    """The variables of a secrets file of the folder, which is deleted once read (none: no file)."""
    path = os.path.join(folder, name)
    try:
        with open(path) as handle:
            secrets = json.load(handle)
    except FileNotFoundError:
        return {}
    os.remove(path)
    return secrets


def run(folder: str) -> int:
    forwarder = Forwarder()
    with open(os.path.join(folder, "request.json")) as handle:
        request = json.load(handle)
    secrets = take_secrets(folder, "request-secrets.json")
    write_atomically(os.path.join(folder, "address"), node_address())
    extra: dict[str, str] | None = {}
    if not request["start"]:
        extra = wait_for_start(folder, forwarder, request.get("start_timeout_s"))
        if extra is None:  # cancelled, or never started: the command never ran
            code = -forwarder.received[0] if forwarder.received else -signal.SIGTERM
            write_atomically(os.path.join(folder, "exit_code"), str(code))
            return 128 - code
    if not request["start"]:
        secrets.update(take_secrets(folder, "start-secrets.json"))  # written before start.json
    env = {**os.environ, **request["env"], **extra, **secrets, "PYTHONUNBUFFERED": "1"}
    cwd = request["cwd"] if request["cwd"] and os.path.isdir(request["cwd"]) else None
    sys.stdout.flush()
    try:
        forwarder.process = subprocess.Popen(request["command"], env=env, cwd=cwd, start_new_session=True)
    except OSError as exc:
        print(f"fray: job {request['name']!r} could not start {request['command'][0]!r}: {exc}", flush=True)
        code = CANNOT_START_EXIT_CODE
    else:
        # A signal sent between Popen and here was meant for the command too.
        for signum in list(forwarder.received):
            os.killpg(forwarder.process.pid, signum)
        code = forwarder.process.wait()
    write_atomically(os.path.join(folder, "exit_code"), str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -I slurm_worker.py JOB_FOLDER", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(sys.argv[1]))
