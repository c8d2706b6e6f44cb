"""A training step run by the runner, stopped from outside: SIGTERM and Ctrl-C checkpoint then stop
(and a rerun resumes there); a lost lease stops training without writing anything more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iris import PREEMPTED_EXIT_CODE
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.execution.records.executor_files import LOCK_FILE, read_status
from marin.execution.ownership.step_ownership import latest_work_path

STEPS = 150  # far more than run before the test interrupts (it signals once step 1 is logged)

# argv: inputs folder, prefix, seed (0: only tokenize). Each seed is another training identity
# over the same tokenized data, so the tests share one tokenization.
SCRIPT = textwrap.dedent(
    f"""
    import sys
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from marin.execution.step_runner import StepRunner
    from marin.experiment.data import tokenized
    from marin.experiment.train import train_lm

    inputs, prefix, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = tokenized("tokenized/stories", inputs + "/train.jsonl", inputs + "/tokenizer")
    model = train_lm(
        name="checkpoints/tiny",
        model=LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=128),
        optimizer=AdamConfig(learning_rate=3e-3),
        datasets={{data: 1.0}},
        batch_size=8,
        seq_len=128,
        num_train_steps={STEPS},
        seed=seed,
        minutes_per_checkpoint=None,
        num_samples=0,
    )
    StepRunner(prefix=prefix, heartbeat_s=0.2).run([model] if seed else [data])
    """
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("interrupts")
    inputs = root / "inputs"
    inputs.mkdir()
    texts = list(synthetic_stories[:150])
    (inputs / "train.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(texts, 512), str(inputs / "tokenizer"))
    (root / "run.py").write_text(SCRIPT)
    prefix = root / "prefix"
    done = _run(root, prefix, seed=0)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, prefix


def _command(root: Path, prefix: Path, seed: int) -> list[str]:
    return [sys.executable, str(root / "run.py"), str(root / "inputs"), str(prefix), str(seed)]


def _run(root: Path, prefix: Path, seed: int) -> subprocess.CompletedProcess:
    return subprocess.run(_command(root, prefix, seed), cwd=root, capture_output=True, text=True, timeout=300)


def _start_until_training(root: Path, prefix: Path, seed: int) -> tuple[subprocess.Popen, Path]:
    """Start a run; return once its training step has logged a step (and its output folder)."""
    process = subprocess.Popen(_command(root, prefix, seed), cwd=root, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and process.poll() is None:
        # A running step writes into its execution's staging folder, <step>/.staging-g<N>.
        for metrics in (prefix / "checkpoints").glob("tiny-*/.staging-g*/metrics.jsonl"):
            if '"loss"' in metrics.read_text() and not (metrics.parent / "checkpoints" / str(STEPS)).exists():
                output = metrics.parent.parent
                if json.loads((output / ".executor_info").read_text())["hash_attrs"]["seed"] == seed:
                    return process, output
        time.sleep(0.05)
    process.kill()
    _, stderr = process.communicate(timeout=30)
    pytest.fail(f"training did not start within 180 s (exit {process.returncode}):\n{stderr[-3000:]}")


def _work(output: Path) -> Path:
    """Where the step's latest execution keeps its files (its staging folder until committed)."""
    return Path(latest_work_path(str(output)))


def _checkpoint_steps(output: Path) -> list[int]:
    folder = _work(output) / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def _logged_steps(output: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (_work(output) / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_sigterm_to_the_runner_checkpoints_training_and_a_rerun_resumes_there(workspace):
    root, prefix = workspace
    process, output = _start_until_training(root, prefix, seed=1)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
    saved = _checkpoint_steps(output)
    assert len(saved) == 1 and 0 < saved[0] < STEPS, stderr[-3000:]
    status = read_status(str(output))
    assert status.status == "FAILED" and "SIGTERM" in status.error

    rerun = _run(root, prefix, seed=1)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resumed from checkpoint step {saved[0]}" in rerun.stderr
    assert read_status(str(output)).status == "SUCCESS"
    assert _logged_steps(output) == list(range(1, STEPS + 1))


def test_ctrl_c_checkpoints_training_before_the_run_stops(workspace):
    root, prefix = workspace
    process, output = _start_until_training(root, prefix, seed=2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr
    saved = _checkpoint_steps(output)
    assert len(saved) == 1 and 0 < saved[0] < STEPS, stderr[-3000:]
    status = read_status(str(output))
    assert status.status == "FAILED" and "interrupted" in status.error
    assert not (_work(output) / "hf").exists() and not (_work(output) / "eval.json").exists()


def test_a_lost_lease_stops_training_without_writing_anything_more(workspace):
    root, prefix = workspace
    process, output = _start_until_training(root, prefix, seed=3)
    # Another runner takes the step over: it rewrites the lock file in its own name, and keeps
    # writing, as a real holder would (a heartbeat in flight may overwrite one write).
    deadline = time.time() + 2
    while time.time() < deadline and process.poll() is None:
        now = time.time()
        thief = {"holder": "thief", "host": "another-host", "pid": 1, "acquired_at": now, "heartbeat_at": now, "ttl_s": 600.0}
        (output / LOCK_FILE).write_text(json.dumps(thief))
        time.sleep(0.1)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode != 0
    assert "TrainingAbandoned" in stderr, stderr[-3000:]
    assert _checkpoint_steps(output) == []
    assert not (_work(output) / "hf").exists() and not (_work(output) / "eval.json").exists()
    assert max(_logged_steps(output)) < STEPS
    assert json.loads((output / LOCK_FILE).read_text())["holder"] == "thief"  # never deleted by the loser
    assert read_status(str(output)).status != "SUCCESS"


COOPERATIVE_SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, time
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner

    def patient(ctx):
        pathlib.Path(sys.argv[1]).write_text(ctx.output_path)
        while True:
            ctx.check_lease()  # raises once the run is interrupted
            time.sleep(0.02)

    StepRunner(prefix=sys.argv[2]).run([StepSpec("patient", patient)])
    """
)


def test_sigterm_stops_any_cooperative_step_and_exits_75_so_schedulers_retry(tmp_path):
    script, marker = tmp_path / "runner.py", tmp_path / "started"
    script.write_text(COOPERATIVE_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), str(marker), str(tmp_path / "prefix")], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the step did not start within 30 s"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr
    status = read_status(str(Path(marker.read_text()).parent))  # the step wrote into <step>/.staging-g1
    assert status.status == "FAILED" and "preempted (SIGTERM)" in status.error


def test_stop_reason_says_why_and_a_lost_lease_comes_first():
    import threading

    from marin.execution.ownership.interrupts import Interrupt, RunInterruption
    from marin.execution.running.step_context import RunCancelled, StepContext, StopReason
    from marin.execution.step_spec import StepSpec

    def context(cancelled: threading.Event, lease_lost: threading.Event | None = None) -> StepContext:
        return StepContext("/unused", StepSpec("s", lambda: None), {}, lease_lost or threading.Event(), cancelled)

    assert context(RunInterruption()).stop_reason() is None
    sigterm = RunInterruption()
    sigterm.interrupt_with(Interrupt.SIGTERM)
    sigterm.interrupt_with(Interrupt.CTRL_C)  # the first interrupt is the reason
    assert context(sigterm).stop_reason() is StopReason.PREEMPTED
    with pytest.raises(RunCancelled, match=r"preempted \(SIGTERM\)"):
        context(sigterm).check_lease()
    plain = threading.Event()
    plain.set()
    assert context(plain).stop_reason() is StopReason.INTERRUPTED
    lost = threading.Event()
    lost.set()
    assert context(sigterm, lost).stop_reason() is StopReason.LEASE_LOST


def _pids_running(needle: str) -> list[int]:
    """Processes whose command line contains ``needle`` (found in /proc: iris starts them in sessions of their own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the replica's process in /proc")
def test_iris_retries_a_marin_run_preempted_by_sigterm_and_it_resumes_to_success(workspace, tmp_path):
    """The command docs/cluster.md shows: `iris job run --max-retries-preemption 2 -- marin run exp.py`."""
    root, prefix = workspace
    bin_folder = Path(sys.executable).parent
    seed = 4
    env = {**os.environ, "IRIS_HOME": str(tmp_path / "iris-home")}
    command = [
        str(bin_folder / "iris"), "job", "run", "--name", "exp", "--max-retries-preemption", "2", "--wait", "--",
        str(bin_folder / "marin"), "run", str(root / "run.py"), "--", str(root / "inputs"), str(prefix), str(seed),
    ]
    job = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        output = None
        deadline = time.time() + 180
        while output is None and time.time() < deadline and job.poll() is None:
            for metrics in (prefix / "checkpoints").glob("tiny-*/.staging-g*/metrics.jsonl"):
                info = json.loads((metrics.parent.parent / ".executor_info").read_text())
                if info["hash_attrs"]["seed"] == seed and '"loss"' in metrics.read_text():
                    output = metrics.parent.parent
            time.sleep(0.05)
        assert output is not None, "training did not start within 180 s"
        replicas = [pid for pid in _pids_running(str(root / "run.py")) if pid != job.pid]
        assert len(replicas) == 1, replicas
        os.kill(replicas[0], signal.SIGTERM)  # what a scheduler reclaiming the machine sends
        stdout, stderr = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr[-3000:]
    assert "SUCCEEDED" in stderr
    status = subprocess.run(
        [str(bin_folder / "iris"), "job", "status", stdout.splitlines()[0]], env=env, capture_output=True, text=True, timeout=60
    ).stdout
    assert "attempts:   2 (preempted 1, failed 0" in status, status
    assert "Resumed from checkpoint step" in stdout
    assert read_status(str(output)).status == "SUCCESS"
    assert _logged_steps(output) == list(range(1, STEPS + 1))
