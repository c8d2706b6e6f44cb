"""Several ``marin run`` processes on one prefix share a sweep: each step runs once, a killed worker's step is retaken."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from marin.execution.records.executor_files import STATUS_SUCCESS, read_status

# Six points of a grid, each a step that notes when it starts and when it finishes, by whom.
SWEEP_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec
    from marin.experiment.sweep import grid, setting_label

    log = sys.argv[1]
    seconds = float(os.environ.get("SWEEP_STEP_SECONDS", "1.0"))

    def point(label):
        def fn(output_path):
            with open(os.path.join(log, label), "a") as handle:
                handle.write(f"start {os.getpid()}\\n")
            time.sleep(seconds)
            with open(os.path.join(output_path, "result.txt"), "w") as handle:
                handle.write(label)
            with open(os.path.join(log, label), "a") as handle:
                handle.write(f"done {os.getpid()}\\n")
        return fn

    settings = grid(width=[16, 32, 64], learning_rate=[1e-3, 3e-3])
    steps = [StepSpec(f"sweep/{setting_label(s)}", point(setting_label(s)), hash_attrs=s) for s in settings]
    StepRunner(poll_s=0.1).run(steps)
    """
)

LABELS = [f"width-{w}_learning_rate-{lr}" for w in (16, 32, 64) for lr in ("0.001", "0.003")]


def _worker(script: Path, log: Path, prefix: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "marin.cli", "run", str(script), "--prefix", str(prefix), "--max-concurrent", "1", "--", str(log)],
        env={**os.environ, **env}, cwd=script.parent, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _events(log: Path) -> dict[str, list[tuple[str, int]]]:
    events = {}
    for label in LABELS:
        path = log / label
        lines = path.read_text().splitlines() if path.exists() else []
        events[label] = [(kind, int(pid)) for kind, pid in (line.split() for line in lines)]
    return events


def _sweep(tmp_path: Path) -> tuple[Path, Path, Path]:
    script, log, prefix = tmp_path / "sweep.py", tmp_path / "log", tmp_path / "prefix"
    script.write_text(SWEEP_SCRIPT)
    log.mkdir()
    return script, log, prefix


def test_two_workers_share_a_six_step_sweep_and_run_no_step_twice(tmp_path):
    script, log, prefix = _sweep(tmp_path)
    workers = [_worker(script, log, prefix) for _ in range(2)]
    outputs = [w.communicate(timeout=180)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs

    events = _events(log)
    for label, happened in events.items():
        assert [kind for kind, _ in happened] == ["start", "done"], (label, happened)
    by_worker = {w.pid: sum(1 for happened in events.values() if happened[-1][1] == w.pid) for w in workers}
    # Shared, not one worker doing everything while the other waits: each took steps of its own.
    assert all(count >= 2 for count in by_worker.values()), by_worker
    assert sum(by_worker.values()) == 6
    assert any("this run takes other work and comes back to it" in out for out in outputs), outputs
    for label in LABELS:
        (folder,) = (prefix / "sweep").glob(f"{label}-*")
        assert read_status(str(folder)).status == STATUS_SUCCESS
        assert (folder / "result.txt").read_text() == label


def test_a_killed_workers_step_is_retaken_by_the_other_and_committed_once(tmp_path):
    script, log, prefix = _sweep(tmp_path)
    doomed = _worker(script, log, prefix, SWEEP_STEP_SECONDS="30")  # slow: it is killed inside a step
    deadline = time.monotonic() + 60
    while not any(kind == "start" for happened in _events(log).values() for kind, _ in happened):
        assert doomed.poll() is None and time.monotonic() < deadline, doomed.communicate()[0] if doomed.poll() is not None else "no step started"
        time.sleep(0.1)
    survivor = _worker(script, log, prefix)
    time.sleep(1.0)  # the survivor finds the doomed worker's step taken and works on the others
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=30)
    output = survivor.communicate(timeout=180)[0]
    assert survivor.returncode == 0, output

    events = _events(log)
    (stolen,) = [label for label, happened in events.items() if happened[0][1] == doomed.pid]
    assert events[stolen] == [("start", doomed.pid), ("start", survivor.pid), ("done", survivor.pid)]
    for label, happened in events.items():
        if label != stolen:
            assert happened == [("start", survivor.pid), ("done", survivor.pid)], (label, happened)
    for label in LABELS:
        (folder,) = (prefix / "sweep").glob(f"{label}-*")
        assert read_status(str(folder)).status == STATUS_SUCCESS
        assert (folder / "result.txt").read_text() == label
