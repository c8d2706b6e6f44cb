"""The web view's image: the command its Dockerfile runs serves the prefix named in MARIN_PREFIX on
the port Cloud Run gives in PORT, and the build context holds every package pyproject installs."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

INFRA = Path(__file__).resolve().parent.parent
ROOT = INFRA.parent
DOCKERFILE = (INFRA / "Dockerfile").read_text()


def _instruction(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in DOCKERFILE.splitlines() if line.startswith(name + " ")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_rows(output_path):
    with open(f"{output_path}/rows.jsonl", "w") as handle:
        handle.write('{"text": "a row"}\n')
    return {"rows": 1}


def test_the_images_command_serves_the_prefix_on_cloud_runs_port(tmp_path):
    prefix = str(tmp_path / "prefix")
    StepRunner(prefix).run([StepSpec(name="data/web-check", fn=_write_rows)])
    [cmd] = _instruction("CMD")
    argv = json.loads(cmd)
    port = _free_port()
    env = {**os.environ, "PORT": str(port), "MARIN_PREFIX": prefix,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        page = None
        while page is None and time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    page = response.read().decode()
            except OSError:
                time.sleep(0.2)
        assert page is not None, f"no answer on port {port}: {server.poll()=}"
        assert "data/web-check" in page
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert f"{prefix} on http://0.0.0.0:{port}/" in output.decode()


def test_the_build_context_holds_every_package_pyproject_installs():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = pyproject["tool"]["setuptools"]["packages"]["find"]
    copied = {line.split()[0] for line in _instruction("COPY")}
    for where in found["where"]:
        if where != ".":
            assert where.split("/")[0] in copied, where
    for pattern in found["include"]:  # top-level packages found at the root ("experiments*", "infra*")
        name = pattern.rstrip("*")
        if (ROOT / name / "__init__.py").exists():
            assert name in copied, name
    assert {"pyproject.toml", "README.md"} <= set(" ".join(_instruction("COPY")).split())
    assert re.search(r"pip install '\.\[gcs\]'", DOCKERFILE)  # gs:// prefixes need gcsfs
    assert _instruction("USER") == ["marin"]
