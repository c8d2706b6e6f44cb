"""``marin slurm start|stop|status`` from separate processes, as a shell uses them, and ``marin run``
on ``iris:slurm`` where no controller is configured: one line naming the command that starts one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from fray.cluster.slurm_local import STATE_DIR_ENV, missing_slurm, running_local_slurm, stop_local_slurm

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the local Slurm is Linux only")
TIMEOUT = 120


def marin(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marin.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env, cwd=cwd)


@pytest.mark.skipif(missing_slurm() is not None, reason=str(missing_slurm()))
def test_start_leaves_slurm_running_for_the_shell_and_stop_ends_it_idempotently():
    # Short, directly under the system's temporary folder: the daemons' unix socket paths must stay short.
    state = Path(tempfile.gettempdir()) / f"slurm-cli-{os.getpid()}"
    env = {**os.environ, STATE_DIR_ENV: str(state)}
    env.pop("SLURM_CONF", None)
    try:
        started = marin("slurm", "start", env=env)
        assert started.returncode == 0, started.stderr
        export = f"export SLURM_CONF={state / 'slurm.conf'}"
        assert started.stdout == export + "\n"  # alone on stdout: eval "$(marin slurm start)" takes it
        assert "started a private Slurm" in started.stderr and "marin slurm stop" in started.stderr

        # The command has returned; the daemons run on, and the line it printed reaches them.
        script = 'eval "$(marin slurm start 2>/dev/null)"; sinfo -h -o "%P %t"'
        shell = subprocess.run(["bash", "-euo", "pipefail", "-c", script],
                               env={**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"},
                               capture_output=True, text=True, timeout=TIMEOUT)
        assert shell.stdout.split() == ["debug*", "idle"], shell.stderr
        status = marin("slurm", "status", env=env)
        assert status.returncode == 0 and "A private Slurm is running" in status.stdout
        assert status.stdout.splitlines()[-1] == export

        again = marin("slurm", "start", env=env)
        assert again.returncode == 0 and again.stdout == started.stdout
        assert "already running" in again.stderr

        pids = running_local_slurm(state).pids
        stopped = marin("slurm", "stop", env=env)
        assert stopped.returncode == 0 and "stopped the private Slurm" in stopped.stderr, stopped.stderr
        assert not state.exists() and all(_gone(pid) for pid in pids.values())
        stopped_again = marin("slurm", "stop", env=env)
        assert stopped_again.returncode == 0 and "nothing to stop" in stopped_again.stderr
        status = marin("slurm", "status", env=env)
        assert status.returncode == 1 and status.stdout.startswith(f"No private Slurm in {state}")
    finally:
        stop_local_slurm(state, grace=1)


EXPERIMENT = """
    from fray.cluster import ResourceConfig
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def never(output_path):
        raise AssertionError("must not run")

    if __name__ == "__main__":
        StepRunner().run([StepSpec("never", never, resources=ResourceConfig.with_cpu())])
"""


@pytest.mark.parametrize("slurm_conf", ["names-no-file", "unset"])
def test_marin_run_on_iris_slurm_without_a_controller_is_one_line_naming_marin_slurm_start(tmp_path, slurm_conf):
    if slurm_conf == "unset" and shutil.which("sinfo") is None:
        pytest.skip("Slurm's commands are not installed (scripts/install_slurm.sh)")
    if slurm_conf == "unset" and os.path.exists("/etc/slurm/slurm.conf"):
        pytest.skip("this machine has a Slurm configuration")
    (tmp_path / "exp.py").write_text(textwrap.dedent(EXPERIMENT))
    env = {**os.environ, "MARIN_CLUSTER": "iris:slurm", "MARIN_PREFIX": str(tmp_path / "prefix"),
           "IRIS_HOME": str(tmp_path / "iris-home"), STATE_DIR_ENV: str(tmp_path / "no-private-slurm")}
    env.pop("SLURM_CONF", None)
    if slurm_conf == "names-no-file":
        env["SLURM_CONF"] = str(tmp_path / "nowhere" / "slurm.conf")
    result = marin("run", str(tmp_path / "exp.py"), env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("marin")]
    assert len(errors) == 1, result.stderr[-3000:]
    expected = ("names no file" if slurm_conf == "names-no-file"
                else "SLURM_CONF is unset and /etc/slurm/slurm.conf does not exist")
    assert "No Slurm controller is configured here" in errors[0] and expected in errors[0]
    assert errors[0].endswith("start a private Slurm on this machine with `marin slurm start`.")


def _gone(pid: int) -> bool:
    """No such process, or a zombie its parent (init, here) has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
