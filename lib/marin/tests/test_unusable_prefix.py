"""A prefix whose storage cannot be reached stops the `marin` command with one line, not a traceback."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

MARIN = Path(sys.executable).parent / "marin"


def _marin(*args: str, prefix: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MARIN_PREFIX": prefix}
    return subprocess.run([str(MARIN), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_marin_status_with_an_unknown_protocol_names_marin_prefix(tmp_path):
    result = _marin("status", prefix="bogus://x", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "MARIN_PREFIX" in result.stderr and "bogus://x" in result.stderr


def test_marin_status_with_a_gs_prefix_without_gcsfs_says_to_install_it(tmp_path):
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here")
    result = _marin("status", prefix="gs://bucket/marin", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "MARIN_PREFIX" in result.stderr and "pip install gcsfs" in result.stderr
