"""Chaos: random SIGKILLs of the runner, a job's supervisor and a step's replica, through ``iris:local``
and the suite's private Slurm. Whatever is killed when, the graph finishes, each step folder was
written by one execution, nothing is lost, nothing hangs, and no process or Slurm job is left.

The graph is four steps (``a``; ``b`` and ``c`` on it; ``d`` on both). Each step appends its pid to
``lines.txt`` in its folder, one line every 50 ms, and never looks at its lease or fence: only the
engine's fencing keeps a fenced-off execution out of the committed output. Each round relaunches
the runner at once whenever it ends without success, as a person would.

What must hold after each round: every step is SUCCESS with exactly its lines, all from one pid (one
writer), whose process is gone; no staging folder is left; no replica process of the prefix runs;
and no job tagged for a step is in the Slurm queue. The suite runs a round per engine (about a
minute each); ``MARIN_CHAOS_KILL_ROUNDS=30`` runs thirty (the figures of the longer run are printed).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iris import JobStore
from marin.execution.records.executor_files import read_status
from rigging.lease import process_alive

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes in /proc")]

ROUNDS = int(os.environ.get("MARIN_CHAOS_KILL_ROUNDS", "1"))
KILLS_PER_ROUND = 3
LINES = 40
ROUND_TIMEOUT_S = 240
MAX_LAUNCHES = 12
STEPS = ("a", "b", "c", "d")

RUNNER = textwrap.dedent(
    f"""
    import os, sys, time
    from fray.cluster import ResourceConfig
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def writes(ctx):
        # Never looks at its lease or fence: only the engine may keep a fenced-off writer out.
        path = os.path.join(ctx.output_path, "lines.txt")
        with open(path, "a") as handle:
            for _ in range({LINES}):
                handle.write(f"{{os.getpid()}}\\n")
                handle.flush()
                time.sleep(0.05)
        return {{"pid": os.getpid()}}

    if __name__ == "__main__":
        resources = ResourceConfig.with_cpu(cpu=1, ram="256m", max_retries_failure=1)
        a = StepSpec("a", writes, resources=resources)
        b = StepSpec("b", writes, deps=[a], resources=resources)
        c = StepSpec("c", writes, deps=[a], resources=resources)
        d = StepSpec("d", writes, deps=[b, c], resources=resources)
        report = StepRunner(prefix=sys.argv[1], cluster=sys.argv[2], lease_ttl_s=3, heartbeat_s=0.5, poll_s=0.2).run(
            [d], max_concurrent=2, raise_on_failure=False, force_run_failed=True)
        print("REPORT", report.summary(), flush=True)
        sys.exit(0 if report.ok else 1)
    """
)


def _replicas(prefix: Path) -> list[int]:
    """The processes running a step's replica (``marin.execution.running.step_job``) for this prefix."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"marin.execution.running.step_job" in command and any(str(prefix).encode() in part for part in command):
                if process_alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


def _supervisors(iris_home: Path) -> list[int]:
    if not iris_home.exists():
        return []
    try:
        jobs = JobStore(iris_home, create=False).all()
    except Exception:  # noqa: BLE001 - the database is being created right now
        return []
    return [job.supervisor_pid for job in jobs if not job.state.finished and job.supervisor_pid and process_alive(job.supervisor_pid)]


def _queued_step_jobs(env: dict[str, str]) -> list[str]:
    if "SLURM_CONF" not in env:
        return []
    out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k"], env=env, capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if "|marin-step-" in line]


def _launch(workdir: Path, prefix: Path, engine: str, env: dict[str, str], number: int) -> subprocess.Popen:
    log = open(workdir / f"runner-{number}.log", "w")
    return subprocess.Popen([sys.executable, str(workdir / "runner.py"), str(prefix), engine], cwd=workdir, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _wait_until(condition, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting until {what}")
        time.sleep(0.2)


def _chaos_round(workdir: Path, engine: str, engine_env: dict[str, str], seed: int) -> list[str]:
    """One graph under random kills; the kills made (the assertions are the module docstring's)."""
    rng = random.Random(seed)
    workdir.mkdir(parents=True)
    (workdir / "runner.py").write_text(RUNNER)
    prefix, iris_home = workdir / "prefix", workdir / "iris-home"
    env = {**os.environ, **engine_env, "IRIS_HOME": str(iris_home)}
    launches = [_launch(workdir, prefix, engine, env, 0)]
    kills: list[str] = []
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    try:
        while len(kills) < KILLS_PER_ROUND and time.monotonic() < deadline and launches[-1].poll() != 0:
            kind = rng.choice(["runner", "supervisor", "replica"])
            driver = launches[-1]
            find = {"runner": lambda: [driver.pid] if driver.poll() is None else [],
                    "supervisor": lambda: _supervisors(iris_home), "replica": lambda: _replicas(prefix)}[kind]
            victims: list[int] = []
            while not victims and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
                victims = find()
            time.sleep(rng.uniform(0.0, 1.5))
            victims = [pid for pid in find() if process_alive(pid)]
            if victims and driver.poll() is None:
                os.kill(rng.choice(victims), signal.SIGKILL)
                kills.append(kind)
            if kind == "runner":
                driver.wait(timeout=30)
            if driver.poll() not in (None, 0):  # relaunched at once, as a person would
                assert len(launches) < MAX_LAUNCHES, f"seed {seed}: {len(launches)} launches, kills {kills}"
                launches.append(_launch(workdir, prefix, engine, env, len(launches)))
        while True:
            driver = launches[-1]
            try:
                driver.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"seed {seed}: the graph did not finish within {ROUND_TIMEOUT_S} s (kills {kills}); "
                            f"{(workdir / f'runner-{len(launches) - 1}.log').read_text()[-3000:]}")
            if driver.returncode == 0:
                break
            assert len(launches) < MAX_LAUNCHES, f"seed {seed}: {len(launches)} launches, kills {kills}"
            launches.append(_launch(workdir, prefix, engine, env, len(launches)))
    finally:
        for driver in launches:
            if driver.poll() is None:
                driver.kill()
                driver.wait(timeout=30)
    for name in STEPS:
        (folder,) = prefix.glob(f"{name}-*")
        status = read_status(str(folder))
        assert status.status == "SUCCESS" and not list(folder.glob(".staging*")), (seed, name, status, kills)
        pids = {int(line) for line in (folder / "lines.txt").read_text().split()}
        lines = (folder / "lines.txt").read_text().split()
        # One writer, and all of its lines: nothing of a fenced-off execution, nothing lost.
        assert len(pids) == 1 and len(lines) == LINES, (seed, name, len(lines), pids, kills)
        assert not process_alive(pids.pop()), (seed, name, kills)
    # Nothing is left running: no replica of any execution, no job in the Slurm queue.
    _wait_until(lambda: not _replicas(prefix), f"seed {seed}: no replica process of the prefix ran (kills {kills})", 60)
    _wait_until(lambda: not _queued_step_jobs(engine_env), f"seed {seed}: no step's job was left in the Slurm queue "
                                                           f"(kills {kills})", 90)
    return kills


def _chaos(tmp_path: Path, engine: str, engine_env: dict[str, str]) -> None:
    made = []
    started = time.monotonic()
    for round_number in range(ROUNDS):
        # Random moments by design; a failure names its seed, and MARIN_CHAOS_SEED replays it.
        seed = int(os.environ.get("MARIN_CHAOS_SEED") or int.from_bytes(os.urandom(4), "little")) + round_number
        made.append((seed, _chaos_round(tmp_path / f"round-{round_number}", engine, engine_env, seed)))
    kills = [kind for _, round_kills in made for kind in round_kills]
    print(f"chaos through {engine}: {len(made)} round(s) in {time.monotonic() - started:.0f} s, {len(kills)} kill(s) "
          f"({', '.join(f'{kind} {kills.count(kind)}' for kind in ('runner', 'supervisor', 'replica'))}): all held; "
          f"seeds and kills {made}")


@pytest.mark.timeout(ROUND_TIMEOUT_S * ROUNDS + 120)
def test_random_kills_through_iris_local_leave_one_writer_per_step_and_nothing_running(tmp_path):
    _chaos(tmp_path, "iris:local", {})


@pytest.mark.timeout(ROUND_TIMEOUT_S * ROUNDS + 120)
def test_random_kills_through_slurm_leave_one_writer_per_step_and_no_job_queued(slurm_cluster, tmp_path):
    _chaos(tmp_path, "iris:slurm", dict(slurm_cluster.env))
