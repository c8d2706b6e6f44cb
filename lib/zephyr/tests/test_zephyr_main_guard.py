"""A script that runs a pipeline on worker processes without ``if __name__ == "__main__":`` fails at
once with the fix, instead of hanging while each worker re-runs the script."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

GUARD = 'if __name__ == "__main__":'
FAST_S = 30  # generous on a loaded machine; a hang lasts until the timeout below


def _run(tmp_path, body: str) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "pipeline.py"
    script.write_text(textwrap.dedent(body))
    env = {key: value for key, value in os.environ.items() if key != "STARTED_ONCE"}
    started = time.monotonic()
    # A session of its own, so a hang can be ended together with the workers it started.
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("the unguarded script hung for 120 s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # workers left behind by a failed run
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), time.monotonic() - started


def test_an_unguarded_pipeline_fails_fast_naming_the_guard(tmp_path):
    result, seconds = _run(
        tmp_path,
        """
        from zephyr import Dataset

        print(Dataset.from_list(list(range(10)), num_shards=2).map(lambda x: x * 2).collect(backend="processes"))
        """,
    )
    assert result.returncode != 0
    assert seconds < FAST_S
    assert GUARD in result.stderr and "pipeline.py" in result.stderr
    assert "out of memory" not in result.stderr


def test_an_unguarded_script_whose_rerun_blocks_fails_fast_instead_of_hanging(tmp_path):
    # A re-run of the script in a worker that blocks before reaching the pipeline (a step runner
    # waiting for the lease its own parent holds) used to leave the parent waiting forever.
    result, seconds = _run(
        tmp_path,
        """
        import os, time
        from zephyr import Dataset

        if os.environ.get("STARTED_ONCE"):
            time.sleep(600)
        os.environ["STARTED_ONCE"] = "1"
        total = sum(Dataset.from_list(list(range(10)), num_shards=2).collect(backend="processes"))
        """,
    )
    assert result.returncode != 0
    assert seconds < FAST_S
    assert GUARD in result.stderr


def test_a_guarded_script_runs_on_worker_processes(tmp_path):
    result, _ = _run(
        tmp_path,
        """
        from zephyr import Dataset

        def main():
            print(sorted(Dataset.from_list(list(range(6)), num_shards=2).map(lambda x: x + 1).collect(backend="processes")))

        if __name__ == "__main__":
            main()
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[1, 2, 3, 4, 5, 6]")
