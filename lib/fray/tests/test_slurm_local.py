"""The machine's private Slurm across processes (fray.cluster.slurm_local), and what a Slurm client
says on a machine where no controller is configured.

The tests that start daemons need slurm-wlm, munge and root, and skip with the reason otherwise; the
others (state folders, stale records, a SLURM_CONF naming no file) run anywhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fray.cluster import ResourceConfig
from fray.cluster.slurm_client import SlurmClient
from fray.cluster.slurm_commands import SlurmNotConfiguredError, SlurmUnavailableError, partitions
from fray.cluster.slurm_local import (
    DAEMONS,
    RECORD_NAME,
    STATE_DIR_ENV,
    LocalSlurmCluster,
    SlurmClusterError,
    missing_slurm,
    running_local_slurm,
    start_local_slurm,
    stop_local_slurm,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the local Slurm is Linux only")
TIMEOUT = 60
needs_slurm = pytest.mark.skipif(missing_slurm() is not None, reason=str(missing_slurm()))


@pytest.fixture
def no_private_slurm(tmp_path, monkeypatch) -> Path:
    """An empty state folder where the messages look for a running private Slurm, so none is found."""
    folder = tmp_path / "none"
    monkeypatch.setenv(STATE_DIR_ENV, str(folder))
    return folder


def test_a_slurm_conf_naming_no_file_is_one_line_naming_the_command_that_starts_a_private_slurm(
        tmp_path, monkeypatch, no_private_slurm):
    # Slurm itself would retry such a file for a minute; the client says so at once.
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nowhere" / "slurm.conf"))
    began = time.monotonic()
    with pytest.raises(SlurmNotConfiguredError) as raised:
        SlurmClient(job_root=str(tmp_path / "jobs")).check_fits(ResourceConfig.with_cpu(cpu=1))
    message = str(raised.value)
    assert time.monotonic() - began < 5
    assert len(message.splitlines()) == 1
    assert f"SLURM_CONF={tmp_path / 'nowhere' / 'slurm.conf'} names no file" in message
    assert "`marin slurm start`" in message
    assert isinstance(raised.value, SlurmUnavailableError)  # what callers that catch an unreachable controller catch


@pytest.mark.skipif(os.path.exists("/etc/slurm/slurm.conf"), reason="this machine has a Slurm configuration")
@pytest.mark.skipif(shutil.which("sinfo") is None, reason="Slurm's commands are not installed (install_slurm.sh)")
def test_no_slurm_configuration_at_all_is_one_line_not_slurms_dns_errors(monkeypatch, no_private_slurm):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(SlurmNotConfiguredError) as raised:
        partitions(timeout=TIMEOUT)
    message = str(raised.value)
    assert len(message.splitlines()) == 1
    assert "SLURM_CONF is unset and /etc/slurm/slurm.conf does not exist" in message
    assert "`marin slurm start`" in message and "resolve_ctls_from_dns_srv" not in message


@needs_slurm
@pytest.mark.skipif(os.path.exists("/etc/slurm/slurm.conf"), reason="this machine has a Slurm configuration")
def test_a_running_private_slurm_is_named_when_slurm_conf_is_unset(slurm_cluster, monkeypatch):
    # The session's cluster was started by start_local_slurm in its own folder: point the default there.
    monkeypatch.setenv(STATE_DIR_ENV, str(slurm_cluster.root))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(SlurmNotConfiguredError) as raised:
        partitions(timeout=TIMEOUT)
    expected = f"a private Slurm is running on this machine: `export SLURM_CONF={slurm_cluster.conf_path}` to use it"
    assert expected in str(raised.value)


def test_a_state_folder_holding_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SlurmClusterError, match="is not empty and holds no local Slurm: choose a new or empty folder"):
        LocalSlurmCluster(state_dir=tmp_path).start()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_state_folder_too_long_for_unix_sockets_is_refused(tmp_path):
    deep = tmp_path / ("x" * 100)
    with pytest.raises(SlurmClusterError, match="too long for the daemons' unix sockets"):
        LocalSlurmCluster(state_dir=deep).start()
    assert not deep.exists()


def test_a_stale_record_never_signals_another_process(tmp_path):
    # After a reboot the recorded pids may belong to anyone: this one's command line does not name the folder.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {"partition": "debug", "node_name": "n", "cpus": 1, "memory_mib": 100, "gpus": {},
                  "kill_wait_s": 5, "controller_port": 1, "node_port": 2,
                  "pids": {name: bystander.pid for name in DAEMONS}, "ready": True}
        (tmp_path / RECORD_NAME).write_text(json.dumps(record))
        assert running_local_slurm(tmp_path) is None
        assert stop_local_slurm(tmp_path, grace=1) is True
        assert bystander.poll() is None
        assert not tmp_path.exists()
        assert stop_local_slurm(tmp_path) is False  # stopping again: nothing there, nothing done
    finally:
        bystander.kill()
        bystander.wait(timeout=TIMEOUT)


def test_an_unreadable_record_is_refused_with_what_to_do(tmp_path):
    (tmp_path / RECORD_NAME).write_text("{not json")
    with pytest.raises(SlurmClusterError, match="is not a local Slurm's record"):
        stop_local_slurm(tmp_path)


@needs_slurm
def test_the_daemons_outlive_the_process_that_started_them_and_stop_ends_them():
    # Short, directly under the system's temporary folder: the daemons' unix socket paths must stay short.
    state = Path(tempfile.gettempdir()) / f"slurm-test-{os.getpid()}"
    start = ("import sys; from fray.cluster.slurm_local import start_local_slurm; "
             "cluster, started = start_local_slurm(sys.argv[1]); print(cluster.export_line, started)")
    try:
        done = subprocess.run([sys.executable, "-c", start, str(state)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"export SLURM_CONF={state / 'slurm.conf'} True"
        cluster = running_local_slurm(state)
        assert cluster is not None and set(cluster.pids) == set(DAEMONS)
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%P %t"], env={**os.environ, **cluster.env}, capture_output=True,
                               text=True, timeout=TIMEOUT)
        assert sinfo.stdout.split() == ["debug*", "idle"], sinfo.stderr
        assert (state / "env").read_text() == f"export SLURM_CONF={state / 'slurm.conf'}\n"

        again, started = start_local_slurm(state)  # already running: the same cluster, nothing started
        assert not started and again.pids == cluster.pids

        # A daemon that died (killed, or a reboot): not running any more, and start clears what is left first.
        os.kill(cluster.pids["slurmd"], signal.SIGKILL)
        deadline = time.monotonic() + TIMEOUT
        while not _gone(cluster.pids["slurmd"]):
            assert time.monotonic() < deadline, "slurmd outlived SIGKILL"
            time.sleep(0.1)
        assert running_local_slurm(state) is None
        cluster, started = start_local_slurm(state)
        assert started and running_local_slurm(state).pids == cluster.pids

        assert stop_local_slurm(state) is True
        assert running_local_slurm(state) is None and not state.exists()
        assert all(_gone(pid) for pid in cluster.pids.values())
    finally:
        stop_local_slurm(state, grace=1)


def _gone(pid: int) -> bool:
    """No such process, or a zombie its parent (init, here) has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_attached_cluster_has_the_settings_it_was_started_with(tmp_path):
    from fray.cluster.slurm_local import LocalSlurmCluster

    started = LocalSlurmCluster(state_dir=tmp_path / "s", cpus=3, kill_wait_s=7, min_job_age_s=60)
    started.root.mkdir(parents=True)
    started.node_name, started.controller_port, started.node_port, started.pids, started.ready = "n", 1, 2, {}, False
    started._write_record()  # what start() writes first, without running any daemon
    attached = LocalSlurmCluster.attach(tmp_path / "s")
    assert (attached.cpus, attached.kill_wait_s, attached.min_job_age_s) == (3, 7, 60)


def test_the_description_says_why_it_declares_more_cpus_than_cores(tmp_path):
    from fray.cluster.slurm_local import LocalSlurmCluster

    cores = os.cpu_count() or 1
    doubled = LocalSlurmCluster(state_dir=tmp_path / "a").describe()  # nothing started: only described
    assert f"({max(4, 2 * cores)} CPUs declared on {cores} cores, since iris's supervisors are Slurm jobs " \
           "that only wait," in doubled
    assert "(1 CPUs, " in LocalSlurmCluster(state_dir=tmp_path / "b", cpus=1).describe()
