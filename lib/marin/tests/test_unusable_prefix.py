"""A prefix whose storage cannot be reached stops the `marin` command with one line, not a traceback."""

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


def test_marin_status_with_a_gs_prefix_without_gcsfs_says_to_install_it(tmp_path, monkeypatch):
    # The test extras install gcsfs: a package of that name that fails to import stands for its absence.
    hidden = tmp_path / "hidden"
    (hidden / "gcsfs").mkdir(parents=True)
    (hidden / "gcsfs" / "__init__.py").write_text("raise ImportError('No module named gcsfs')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")]))
    result = _marin("status", prefix="gs://bucket/marin", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "MARIN_PREFIX" in result.stderr and "pip install gcsfs" in result.stderr


def test_a_prefix_on_a_store_that_cannot_hold_leases_is_refused_before_any_step_runs(tmp_path):
    import fsspec

    from marin.execution.step_runner import PrefixNotWritableError, StepRunner
    from marin.execution.step_spec import StepSpec

    class PlainStore(fsspec.AbstractFileSystem):  # a filesystem with no conditional writes
        protocol = ("plainstore",)

    fsspec.register_implementation("plainstore", PlainStore, clobber=True)
    calls = []
    with pytest.raises(PrefixNotWritableError, match="plainstore:// cannot hold one safely"):
        StepRunner(prefix="plainstore://bucket/marin").run([StepSpec("pre", lambda: calls.append(1))])
    assert calls == []
