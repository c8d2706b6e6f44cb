"""A step graph through iris on real cluster engines, preempted twice, equal to a run on one machine.

``scripts/tiny_graph.py`` (tokenize -> train with a checkpoint every few steps -> evaluate) runs as
a user runs it, with ``MARIN_CLUSTER=iris:slurm`` on the suite's private Slurm and with
``MARIN_CLUSTER=iris:ray`` on a two-node Ray cluster of this machine. While it trains, the test
preempts the training step twice, at two different steps, the way each engine does it: Slurm's
``scancel --batch --signal=TERM`` and SIGTERM to the replica's process on Ray (a reclaimed
machine). Each time the step checkpoints, exits 75, and iris runs it again from the checkpoint.

What must hold: iris spent exactly 2 preemptions and no failure; the step's folder keeps three
attempts (PREEMPTED, PREEMPTED, SUCCEEDED) with their logs; and the final metrics, the arrays of
every checkpoint both runs kept, the ``hf/`` export and the evaluation's scores equal an
uninterrupted run of the same script in this process's machine without any cluster, bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from iris import JobStore
from iris.attempt_log import list_attempts, read_log
from marin.execution.records.executor_files import read_status
from marin.execution.ownership.step_ownership import latest_work_path
from rigging.lease import process_alive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the engines' local clusters find processes in /proc"),
]

SCRIPT = Path(__file__).parent / "scripts" / "tiny_graph.py"
# Every graph of this module trains this many steps: the reference, each preempted run, each chaos round.
STEPS = 120
CHECKPOINT_EVERY = 20
# Preempt once the training step has logged this many steps, then again once the next attempt has
# trained this many steps past where the first one stopped. A preemption lands within about ten steps
# of its signal on a busy machine: training still runs when the second one lands.
FIRST_PREEMPTION_AT = 10
SECOND_PREEMPTION_AFTER = 20
DRIVER_TIMEOUT_S = 420
TIMING_KEYS = {"time", "seconds", "step_seconds", "tokens_per_second", "mfu", "elapsed", "wall_time", "throughput"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_stories):
    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer

    root = tmp_path_factory.mktemp("inputs")
    train, validation = list(synthetic_stories[:120]), list(synthetic_stories[300:320])
    for name, texts in (("train", train), ("validation", validation)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(train, 384), str(root / "tokenizer"))
    return root


def _run_graph(inputs: Path, workdir: Path, env: dict[str, str]) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "driver.out", "w") as out, open(workdir / "driver.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), str(inputs), str(STEPS), str(CHECKPOINT_EVERY)],
            cwd=workdir, env={**os.environ, **env}, stdout=out, stderr=err,
        )


def _finish(driver: subprocess.Popen, workdir: Path) -> dict:
    try:
        driver.wait(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait(timeout=30)
    errors = (workdir / "driver.err").read_text(errors="replace")[-6000:]
    assert driver.returncode == 0, f"the driver failed ({driver.returncode}):\n{errors}"
    line = next(line for line in (workdir / "driver.out").read_text().splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


@pytest.fixture(scope="module")
def uninterrupted(inputs, tmp_path_factory):
    """The same script on this machine, no cluster setting: the reference every cluster run must equal."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    report = _finish(_run_graph(inputs, workdir, {"MARIN_PREFIX": str(workdir / "prefix"), "MARIN_CLUSTER": "local"}), workdir)
    assert report["ran"] == ["tokenized/stories", "checkpoints/tiny", "evaluation/tiny"]
    return report["outputs"]


def _logged_steps(train_folder: Path) -> list[int]:
    metrics = Path(latest_work_path(str(train_folder))) / "metrics.jsonl"  # the staging folder while it trains
    if not metrics.exists():
        return []
    steps = []
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if "loss" in record:
            steps.append(record["step"])
    return steps


def _train_folder(prefix: Path) -> Path | None:
    found = list((prefix / "checkpoints").glob("tiny-*"))
    return found[0] if found else None


def _wait_for(condition: Callable[[], object], what: str, driver: subprocess.Popen, workdir: Path, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if driver.poll() is not None:
            pytest.fail(f"the driver ended ({driver.returncode}) before {what}:\n"
                        f"{(workdir / 'driver.err').read_text(errors='replace')[-4000:]}")
        time.sleep(0.05)
    pytest.fail(f"gave up waiting for {what} after {timeout} s")


def _preempt_training_twice(prefix: Path, driver: subprocess.Popen, workdir: Path, preempt: Callable[[Path], None]) -> list[int]:
    """Preempt the training step at two different steps; the steps it had logged each time."""
    train = _wait_for(lambda: _train_folder(prefix), "the training step to start", driver, workdir)
    seen = []
    floor = FIRST_PREEMPTION_AT
    for attempt in (1, 2):
        def running_attempt_past(number: int = attempt, step_floor: int = floor):
            attempts = list_attempts(str(train))
            if len(attempts) != number or attempts[-1].record is None or attempts[-1].record.finished:
                return False
            logged = _logged_steps(train)
            return bool(logged) and max(logged) >= step_floor

        _wait_for(running_attempt_past, f"attempt {attempt} of the training step to pass step {floor}", driver, workdir)
        seen.append(max(_logged_steps(train)))
        assert seen[-1] < STEPS, "training ended before the test could preempt it; raise STEPS"
        preempt(train)
        # The next floor counts from where this attempt stopped (it trains on until the signal lands),
        # so the next attempt has logged steps of its own, and runs, when it is preempted.
        def attempt_ended(number: int = attempt) -> bool:
            attempts = list_attempts(str(train))
            return len(attempts) >= number and attempts[number - 1].record is not None and attempts[number - 1].record.finished

        _wait_for(attempt_ended, f"attempt {attempt} of the training step to end", driver, workdir)
        floor = max(_logged_steps(train)) + SECOND_PREEMPTION_AFTER
    return seen


def _deterministic(metrics: Path) -> list[dict]:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [{key: value for key, value in record.items() if key not in TIMING_KEYS and "second" not in key and "time" not in key}
            for record in records]


def _checkpoint_arrays(folder: Path) -> dict[int, dict]:
    from levanter.trainer.checkpoint_arrays import open_checkpoint_arrays

    arrays = {}
    for step in (folder / "checkpoints").iterdir():
        if step.name.isdigit():
            with open_checkpoint_arrays(str(step)) as checkpoint:
                arrays[int(step.name)] = checkpoint.read(sorted(checkpoint.stored))
    return arrays


def _assert_equal_to_uninterrupted(outputs: dict, reference: dict) -> None:
    import numpy as np

    train, expected = Path(outputs["checkpoints/tiny"]), Path(reference["checkpoints/tiny"])
    assert _deterministic(train / "metrics.jsonl") == _deterministic(expected / "metrics.jsonl")
    ours, theirs = _checkpoint_arrays(train), _checkpoint_arrays(expected)
    # The newest checkpoints kept (keep_last): the last step's in both. A run preempted late may keep the
    # checkpoint it saved when signalled (step 102, say) where the uninterrupted run kept the grid's (100).
    assert STEPS in ours and STEPS in theirs and len(ours) == len(theirs), (sorted(ours), sorted(theirs))
    for step in sorted(set(ours) & set(theirs)):
        assert sorted(ours[step]) == sorted(theirs[step])
        for name in ours[step]:
            assert np.array_equal(ours[step][name], theirs[step][name]), f"checkpoint {step}: {name} differs"
    for name in sorted(p.name for p in (expected / "hf").iterdir()):
        assert (train / "hf" / name).read_bytes() == (expected / "hf" / name).read_bytes(), f"hf/{name} differs"
    scores = json.loads((Path(outputs["evaluation/tiny"]) / ".artifact.json").read_text())["result"]["datasets"]
    assert scores == json.loads((Path(reference["evaluation/tiny"]) / ".artifact.json").read_text())["result"]["datasets"]


def _assert_preempted_twice_and_logged(outputs: dict, iris_home: Path, preempted_at: list[int]) -> None:
    train = outputs["checkpoints/tiny"]
    attempts = list_attempts(train)
    assert [a.record.outcome for a in attempts] == ["PREEMPTED", "PREEMPTED", "SUCCEEDED"], [a.describe() for a in attempts]
    assert len(set(preempted_at)) == 2
    job_id = attempts[0].record.job_id
    assert {a.record.job_id for a in attempts} == {job_id}
    record = JobStore(iris_home).get(job_id)
    assert (record.state.value, record.preemptions, record.failures, record.attempts) == ("SUCCEEDED", 2, 0, 3)
    assert all(len(a.record.engine_jobs) == 1 and a.record.engine_jobs[0] for a in attempts)  # one replica each
    logs = [read_log(a.logs[0]).decode(errors="replace") for a in attempts]
    assert all("marin.execution.running.step_job" in text for text in logs)
    assert "Resumed from checkpoint step" not in logs[0]
    assert all("Resumed from checkpoint step" in text for text in logs[1:])
    saved = set(re.findall(r"Checkpoint of step (\d+) handed to the writer", "".join(logs)))
    assert len(saved) >= 3, saved
    _assert_attempts_on_the_serve_step_page(train, [a.record.job_attempt for a in attempts])
    # The other steps ran once each, as jobs of their own.
    for name in ("tokenized/stories", "evaluation/tiny"):
        (only,) = list_attempts(outputs[name])
        assert only.record.outcome == "SUCCEEDED" and only.record.job_id not in (None, job_id)


def _assert_attempts_on_the_serve_step_page(train: str, job_attempts: list[int]) -> None:
    """marin serve's step page lists the three attempts, and each opens its log."""
    from fastapi.testclient import TestClient

    from marin.serve.app import create_app

    prefix, relative = str(Path(train).parent.parent), str(Path(train).relative_to(Path(train).parent.parent))
    with TestClient(create_app(prefix)) as client:
        listed = client.get("/api/attempts", params={"path": relative}).json()["attempts"]
        assert [row["outcome"] for row in listed] == ["PREEMPTED", "PREEMPTED", "SUCCEEDED"], listed
        page = client.get("/step", params={"path": relative})
        assert page.status_code == 200 and page.text.count("PREEMPTED") >= 2
        for attempt in (1, 2, 3):
            log = client.get("/api/log", params={"path": relative, "attempt": attempt}).json()
            assert "marin.execution.running.step_job" in log["text"]


def _through_iris(inputs, tmp_path, engine_env: dict[str, str], preempt: Callable[[Path], None], uninterrupted: dict) -> None:
    prefix, iris_home = tmp_path / "prefix", tmp_path / "iris-home"
    env = {**engine_env, "MARIN_PREFIX": str(prefix), "IRIS_HOME": str(iris_home)}
    driver = _run_graph(inputs, tmp_path / "driver", env)
    try:
        preempted_at = _preempt_training_twice(prefix, driver, tmp_path / "driver", preempt)
        outputs = _finish(driver, tmp_path / "driver")["outputs"]
    finally:
        if driver.poll() is None:
            driver.kill()
    _assert_preempted_twice_and_logged(outputs, iris_home, preempted_at)
    _assert_equal_to_uninterrupted(outputs, uninterrupted)
    _assert_progress_on_the_console((tmp_path / "driver" / "driver.err").read_text(errors="replace"))


def _assert_progress_on_the_console(console: str) -> None:
    """The training step's progress reached the runner's console from the job's log, as a local run shows it:
    once how to follow the whole log, and step, loss, tokens/s and ETA lines, the last one the final step."""
    assert console.count("Step checkpoints/tiny: its progress is shown here at most every 30s; the whole log: "
                         "marin logs checkpoints/tiny --follow") == 1
    relayed = re.findall(rf"Step checkpoints/tiny: step (\d+)/{STEPS} loss \S+ .* tokens/s .*ETA \S+", console)
    assert len(relayed) >= 3, console[-4000:]  # each attempt's first and last, at least
    assert int(relayed[-1]) == STEPS


def _slurm_jobs_running(name_part: str, env: dict[str, str]) -> list[str]:
    listing = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %j"], env=env, capture_output=True, text=True,
                             timeout=30, check=True).stdout
    # A job's supervisor is a Slurm job too (iris.placement): only replicas are preempted here.
    return [line.split()[0] for line in listing.splitlines() if name_part in line and "iris-supervisor-" not in line]


@pytest.mark.timeout(900)
def test_graph_through_iris_on_slurm_survives_two_preemptions_bit_for_bit(slurm_cluster, inputs, uninterrupted, tmp_path):
    env = {**os.environ, **slurm_cluster.env}

    def preempt(train: Path) -> None:
        # What Slurm itself does before preempting a job: SIGTERM to the batch script, which hands it on.
        (job,) = _slurm_jobs_running("checkpoints", env)
        # The attempt's record names the Slurm job its replica runs as (the web view's attempts table shows it).
        assert list_attempts(str(train))[-1].record.engine_jobs == (job,)
        subprocess.run(["scancel", "--batch", "--signal=TERM", job], env=env, check=True, timeout=30)

    _through_iris(inputs, tmp_path, {**slurm_cluster.env, "MARIN_CLUSTER": "iris:slurm"}, preempt, uninterrupted)


def _replica_processes(call_part: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "marin.execution.running.step_job" in command and call_part in command:
                pids.append(int(entry.name))
    return pids


@pytest.mark.timeout(900)
def test_graph_through_iris_on_two_ray_nodes_survives_two_preemptions_bit_for_bit(inputs, uninterrupted, tmp_path):
    pytest.importorskip("ray", reason="the Ray engine needs `pip install 'marin[ray]'`")
    from fray.cluster.ray_nodes import LocalRayCluster

    def preempt(train: Path) -> None:
        # A reclaimed machine: SIGTERM to the replica's process, wherever Ray placed it.
        (pid,) = _replica_processes(str(train))
        os.kill(pid, signal.SIGTERM)

    with LocalRayCluster() as nodes:
        nodes.start_head("head", cpus=2)
        nodes.add_node("worker", cpus=2)
        engine_env = {**nodes.env, **nodes.driver_env, "MARIN_CLUSTER": "iris:ray"}
        _through_iris(inputs, tmp_path, engine_env, preempt, uninterrupted)


# -- chaos: random kills of every process on the cluster path -------------------------------------------

# Rounds per engine in the suite (each a whole graph with kills); MARIN_CHAOS_ROUNDS runs more by hand.
CHAOS_ROUNDS = int(os.environ.get("MARIN_CHAOS_ROUNDS", "1"))
KILLS_PER_ROUND = 3
MAX_LAUNCHES = 10


def _supervisors(iris_home: Path) -> list[int]:
    if not iris_home.exists():
        return []
    try:
        jobs = JobStore(iris_home, create=False).all()
    except Exception:  # noqa: BLE001 - the database is being created right now
        return []
    return [job.supervisor_pid for job in jobs if not job.state.finished and job.supervisor_pid and process_alive(job.supervisor_pid)]


def _committed_generations(folder: str) -> set[str]:
    """The executions whose replica 0 logged that it committed the step's output."""
    found: set[str] = set()
    for attempt in list_attempts(folder):
        for url in attempt.logs:
            found.update(re.findall(r"execution (g\d+) committed its output", read_log(url).decode(errors="replace")))
    return found


def _chaos_round(inputs: Path, workdir: Path, engine_env: dict[str, str], seed: int, uninterrupted: dict) -> list[str]:
    """Run the graph while killing a random process (runner, supervisor, replica) at random moments,
    relaunching the runner whenever it ended without success; the kills made."""
    import random

    rng = random.Random(seed)
    prefix, iris_home = workdir / "prefix", workdir / "iris-home"
    env = {**engine_env, "MARIN_PREFIX": str(prefix), "IRIS_HOME": str(iris_home)}
    launches = [_run_graph(inputs, workdir / "driver-0", env)]
    kills: list[str] = []
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    try:
        while len(kills) < KILLS_PER_ROUND and time.monotonic() < deadline:
            # The kind first, then a random moment once such a process exists (a runner takes seconds
            # to submit its first job: picking among what exists would mostly hit runners).
            kind = rng.choice(["runner", "supervisor", "replica"])
            driver = launches[-1]
            victims: list[int] = []
            while not victims and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
                victims = {"runner": lambda: [driver.pid], "supervisor": lambda: _supervisors(iris_home),
                           "replica": lambda: _replica_processes(str(prefix))}[kind]()
            if driver.poll() == 0:
                break  # the graph finished before every kill was made
            time.sleep(rng.uniform(0.0, 5.0))
            victims = [pid for pid in victims if process_alive(pid)]
            if victims and driver.poll() is None:
                os.kill(rng.choice(victims), signal.SIGKILL)
                kills.append(kind)
            if kind == "runner":
                driver.wait(timeout=30)
            else:
                time.sleep(1.0)  # a runner whose job failed ends within its poll interval
            if driver.poll() not in (None, 0):
                assert len(launches) < MAX_LAUNCHES, f"seed {seed}: {len(launches)} launches, kills {kills}"
                launches.append(_run_graph(inputs, workdir / f"driver-{len(launches)}", env))
        while True:
            driver = launches[-1]
            try:
                driver.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"seed {seed}: the graph did not finish within {DRIVER_TIMEOUT_S} s (kills {kills})")
            if driver.returncode == 0:
                break
            assert len(launches) < MAX_LAUNCHES, f"seed {seed}: {len(launches)} launches, kills {kills}"
            launches.append(_run_graph(inputs, workdir / f"driver-{len(launches)}", env))
        outputs = _finish(driver, workdir / f"driver-{len(launches) - 1}")["outputs"]
    finally:
        for driver in launches:
            if driver.poll() is None:
                driver.kill()
                driver.wait(timeout=30)
    _assert_equal_to_uninterrupted(outputs, uninterrupted)
    for name, folder in outputs.items():
        status = read_status(folder)
        assert status.status == "SUCCESS" and not list(Path(folder).glob(".staging*")), (seed, name, status)
        # One execution made the output: at most one logged its commit (a commit cut short by a kill
        # is finished by the next runner, whose log says so), and it is the one SUCCESS names.
        committed = _committed_generations(folder)
        assert committed <= {f"g{status.generation}"}, (seed, name, committed, status.generation, kills)
    return kills


def _chaos(inputs, tmp_path, engine_env: dict[str, str], uninterrupted: dict) -> None:
    made = []
    for round_number in range(CHAOS_ROUNDS):
        # Random moments by design; a failure names its seed, and MARIN_CHAOS_SEED replays it.
        seed = int(os.environ.get("MARIN_CHAOS_SEED") or int.from_bytes(os.urandom(4), "little")) + round_number
        kills = _chaos_round(inputs, tmp_path / f"round-{round_number}", engine_env, seed, uninterrupted)
        made.append((seed, kills))
    print(f"chaos: {len(made)} round(s), {sum(len(k) for _, k in made)} kill(s): {made}")


@pytest.mark.timeout(1800)
def test_random_kills_through_iris_local_leave_outputs_equal_to_an_uninterrupted_run(inputs, uninterrupted, tmp_path):
    _chaos(inputs, tmp_path, {"MARIN_CLUSTER": "iris:local"}, uninterrupted)


@pytest.mark.timeout(1800)
def test_random_kills_through_iris_slurm_leave_outputs_equal_to_an_uninterrupted_run(slurm_cluster, inputs, uninterrupted,
                                                                                       tmp_path):
    _chaos(inputs, tmp_path, {**slurm_cluster.env, "MARIN_CLUSTER": "iris:slurm"}, uninterrupted)
