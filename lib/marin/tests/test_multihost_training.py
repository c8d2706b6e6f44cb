"""A training step on several hosts, simulated on the CPU: four processes (the iris replicas of one
step, as a TPU slice of four hosts runs it), two simulated devices each, train the tutorial's model
sharded fsdp=8 over all eight devices, and match one process training on eight devices and on one.
Killing one of the four fails the whole attempt at once, and iris runs the step again as one gang,
which resumes from its checkpoint.

Every run is a runner in a subprocess of its own under a hard timeout, its iris jobs stopped
whatever happens: XLA's CPU collectives have stalled under load, and a test must never hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from iris import JobStore
from iris.attempt_log import list_attempts, read_log
from iris.jobs import stop_job
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[3]
STEPS = 6
RUN_TIMEOUT_S = 240  # four processes compiling at once on a busy 2-core machine take minutes
# Where a four-process run's time goes: each replica compiles every program itself, the weight
# initialisation (jit(floating_part), as costly to compile as the training step) first. The
# persistent compilation cache does not save this here: on the CPU, JAX keys an entry by the
# process's own device topology, so the keys differ between processes, and only process 0 writes
# entries; processes 1-3 compile cold in every run and every attempt (process 0 then waits for
# them in the first collective). jax_share_binary_between_hosts, which would let process 0 compile
# for all, hangs the CPU run at its first cross-process program.
# The first test to run waits for the three runs of the module's fixture, each under RUN_TIMEOUT_S.
pytestmark = pytest.mark.timeout(4 * RUN_TIMEOUT_S + 60)
KILLED_REPLICA = 2  # not replica 0, whose process also holds jax.distributed's coordinator

# argv: inputs folder, prefix, processes, fsdp. One process with fsdp=1 takes the mesh with_cpu()
# gives (one device); the others name theirs. All train one identity: the mesh and the resources
# are placement, so each run writes under a prefix of its own.
SCRIPT = textwrap.dedent(
    f"""
    import dataclasses, json, sys
    from fray.cluster import ResourceConfig
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig
    from marin.execution.artifact import load_artifact
    from marin.execution.step_runner import StepRunner
    from marin.experiment.data import tokenized
    from marin.experiment.train import TrainedModel, train_lm

    from experiments.llama import llama_nano

    inputs, prefix, processes, fsdp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    data = tokenized("tokenized/stories", inputs + "/train.jsonl", inputs + "/tokenizer")
    model = train_lm(
        "checkpoints/nano",
        model=llama_nano,
        optimizer=AdamConfig(learning_rate=3e-3),
        datasets={{data: 1.0}},
        batch_size=8,
        seq_len=64,
        num_train_steps={STEPS},
        steps_per_checkpoint=2,
        minutes_per_checkpoint=None,
        num_samples=0,
        resources=ResourceConfig.with_cpu(ram="1g", replicas=processes, max_retries_failure=1),
        mesh=MeshConfig(data=1, fsdp=fsdp) if fsdp > 1 else None,
    )
    StepRunner(prefix=prefix).run([data])  # in this process: tokenizing is not what is tested
    report = StepRunner(prefix=prefix, cluster="iris:local" if processes > 1 else "local").run([model])
    result = load_artifact(report.outcome_of("checkpoints/nano").output_path, TrainedModel).result
    losses = [json.loads(line)["loss"] for line in open(result.metrics_path) if '"loss"' in line]
    print("RESULT " + json.dumps({{"identity": model.identity, "output": result.output_path, "losses": losses,
                                  "mesh": dataclasses.asdict(result.mesh)}}), flush=True)
    """
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("multihost-inputs")
    (root / "train.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in synthetic_stories[:150]))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:150], 512), str(root / "tokenizer"))
    (root / "run.py").write_text(SCRIPT)
    return root


class Run:
    """One runner in a subprocess: ``processes`` replicas of ``devices`` simulated CPU devices each."""

    def __init__(self, inputs: Path, folder: Path, processes: int, devices: int, fsdp: int) -> None:
        self.folder, self.prefix, self.iris_home = folder, folder / "prefix", folder / "iris"
        folder.mkdir(parents=True)
        # Each process simulates its own devices and keeps the suite's compile flags (see conftest.py).
        flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
                 if not flag.startswith("--xla_force_host_platform_device_count")]
        env = {key: value for key, value in os.environ.items() if not key.startswith(("IRIS_", "JAX_COORDINATOR"))}
        env.update(
            JAX_PLATFORMS="cpu",
            JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
            XLA_FLAGS=" ".join([f"--xla_force_host_platform_device_count={devices}", *flags]),
            IRIS_HOME=str(self.iris_home),
            # Forwarded to every replica (iris passes MARIN_ variables on): how this test finds them.
            MARIN_TEST_RUN=str(folder),
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            PYTHONUNBUFFERED="1",
        )
        self.log = folder / "runner.log"
        with open(self.log, "w") as handle:
            # Output to a file, not a pipe: nobody reads a pipe while the test waits.
            self.process = subprocess.Popen(
                [sys.executable, str(inputs / "run.py"), str(inputs), str(self.prefix), str(processes), str(fsdp)],
                env=env, cwd=folder, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def result(self) -> dict:
        """Wait for the runner (killing it and its jobs past the timeout, or whatever stops the wait); what it printed."""
        try:
            self.process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.end()
        output = self.log.read_text(errors="replace")
        lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
        if self.process.returncode != 0 or not lines:
            pytest.fail(f"the runner exited with {self.process.returncode} (timeout {RUN_TIMEOUT_S}s):\n{output[-6000:]}")
        return json.loads(lines[-1][len("RESULT "):])

    def end(self) -> None:
        """Kill the runner if it still runs, and stop every iris job of this run still going (their
        supervisors are detached from the runner)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        store = JobStore(self.iris_home, create=False)
        for record in store.all():
            if not record.state.finished:
                stop_job(record.job_id, store, timeout=15)


def _train(inputs: Path, folder: Path, processes: int, devices: int, fsdp: int) -> dict:
    return Run(inputs, folder, processes, devices, fsdp).result()


@pytest.fixture(scope="module")
def runs(inputs, tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost-runs")
    # One after the other: each already keeps both cores busy.
    return {
        "one device": _train(inputs, root / "one-device", processes=1, devices=1, fsdp=1),
        "one process, eight devices": _train(inputs, root / "eight-devices", processes=1, devices=8, fsdp=8),
        "four processes": _train(inputs, root / "four-processes", processes=4, devices=2, fsdp=8),
    }


# The tolerance, from the arithmetic. Every run starts from the same f32 weights and reads the same
# rows; only the order of the sums differs (8 devices and a cross-process all-reduce against one
# device's loop). The first loss is a mean of B x T = 8 x 64 = 512 token losses, all positive: summed
# in any order its relative error is at most about log2(512) x eps_f32 = 9 x 1.2e-7 ~ 1.1e-6. Later
# steps add the updates computed from gradients rounded the same way; Adam turns a gradient element
# into a step of about lr x sign (a ratio of moments, blind to a relative error in the gradient),
# changed by rounding only where the element is itself about zero, which moves the loss at second order. A margin of ten over the first bound
# holds the whole few-step trajectory; a real difference (a batch row read twice, a shard missed)
# moves the loss by 1e-3 or more.
RTOL = 10 * 9 * float(np.finfo(np.float32).eps)


@pytest.mark.slow
def test_four_processes_train_the_tutorial_model_sharded_like_one_process(runs):
    one, eight, four = runs["one device"], runs["one process, eight devices"], runs["four processes"]
    # One step identity: the mesh and the resources are placement.
    assert one["identity"] == eight["identity"] == four["identity"]
    # The record says what mesh ran.
    assert one["mesh"] == {"data": 1, "fsdp": 1, "experts": 1, "model": 1, "processes": 1}
    assert eight["mesh"] == {"data": 1, "fsdp": 8, "experts": 1, "model": 1, "processes": 1}
    assert four["mesh"] == {"data": 1, "fsdp": 8, "experts": 1, "model": 1, "processes": 4}

    assert len(one["losses"]) == STEPS and one["losses"][-1] < one["losses"][0]
    np.testing.assert_allclose(four["losses"], eight["losses"], rtol=RTOL)
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=RTOL)

    # Every process joined one jax.distributed runtime through the coordinator iris gave it.
    output = Path(four["output"])
    (attempt,) = list_attempts(str(output))
    logs = [read_log(url).decode(errors="replace") for url in attempt.logs]
    for index, log in enumerate(logs):
        assert f"Joining a 4-process JAX run as process {index} (coordinator 127.0.0.1:" in log
        assert f"Process {index} of 4: 2 local devices, 8 in all." in log


def _replica_pid(run: Path, replica: int, attempt: int) -> int | None:
    """The process of one replica of this run's job, found by the variables iris started it with."""
    wanted = {f"MARIN_TEST_RUN={run}", f"IRIS_REPLICA_INDEX={replica}", f"IRIS_ATTEMPT={attempt}"}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:  # gone, or not ours
            continue
        if {item.encode() for item in wanted} <= environ:
            return int(entry.name)
    return None


def _wait_for(predicate, what: str, run: Run, timeout: float = RUN_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if run.process.poll() is not None:
            pytest.fail(f"the runner ended before {what}:\n{run.log.read_text(errors='replace')[-6000:]}")
        time.sleep(0.1)
    run.end()
    pytest.fail(f"timed out waiting for {what}")


# How long after the kill the attempt may end: iris notices an exited replica within a poll (0.1 s)
# and stops the others together, each given 5 s after SIGTERM (peers blocked in a collective with
# the dead process ignore it) before SIGKILL. Left alone, those peers would wait in the collective
# until jax.distributed's heartbeat timeout (100 s), or for ever.
ATTEMPT_ENDS_WITHIN_S = 30


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the replica to kill through /proc")
def test_killing_one_of_four_processes_fails_the_attempt_and_iris_reruns_the_gang(inputs, runs, tmp_path):
    run = Run(inputs, tmp_path / "killed", processes=4, devices=2, fsdp=8)
    try:
        # Once the killed replica has logged step 3, the checkpoint of step 2 is on disk.
        def replica_logged_step_3():
            return any(len(path.read_text().splitlines()) >= 3
                       for path in run.prefix.glob(f"checkpoints/*/.staging-g*/metrics.process-{KILLED_REPLICA}.jsonl"))

        _wait_for(replica_logged_step_3, "step 3 of the first attempt", run)
        pid = _wait_for(lambda: _replica_pid(run.folder, KILLED_REPLICA, attempt=1), "the replica's process", run)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        result = run.result()
    finally:
        run.end()

    first, second = list_attempts(result["output"])
    assert first.record.outcome == "FAILED" and first.record.replicas == 4
    assert first.record.exit_codes[KILLED_REPLICA] == -signal.SIGKILL
    assert f"replica {KILLED_REPLICA} was killed by signal {int(signal.SIGKILL)}" in first.record.reason
    assert first.record.ended_at - killed_at < ATTEMPT_ENDS_WITHIN_S
    # The whole gang ran again, and resumed from the checkpoint the first attempt wrote together.
    assert second.record.outcome == "SUCCEEDED" and second.record.exit_codes == (0, 0, 0, 0)
    second_logs = [read_log(url).decode(errors="replace") for url in second.logs]
    assert all("Resumed from checkpoint step" in log for log in second_logs)
    (job,) = JobStore(run.iris_home).all()
    assert (job.attempts, job.failures) == (2, 1)
    # ... to the trajectory the uninterrupted four processes trained.
    np.testing.assert_allclose(result["losses"], runs["four processes"]["losses"], rtol=RTOL)
    assert result["mesh"] == runs["four processes"]["mesh"]
