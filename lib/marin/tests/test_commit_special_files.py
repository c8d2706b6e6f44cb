"""A step whose output holds a special file, or a link out of it or to nothing, is refused at its commit
in one line naming each, without blocking or reading for ever; the next try starts from a clean folder.

Each run is a subprocess with a timeout: before the commit refused such files it opened a FIFO to
hash it (blocking for ever, deaf to one SIGTERM) and read ``/dev/zero`` at 100% CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marin.execution.records.executor_files import read_status

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs and /dev/zero are Linux (POSIX) files")

RUNNER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec
    from fray.cluster import ResourceConfig

    prefix, cluster, markers = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def make(output_path):
        os.makedirs(output_path, exist_ok=True)
        Path(output_path, "data.txt").write_text("rows\\n")
        os.symlink("data.txt", os.path.join(output_path, "latest"))  # a link inside, to a regular file: fine
        # The special entry only on the first try, as a step fixed between two tries would.
        kind = (markers / "kind").read_text()
        first = not (markers / "tried").exists()
        (markers / "tried").touch()
        if first:
            special = os.path.join(output_path, "special")
            if kind == "fifo":
                os.mkfifo(special)
            elif kind == "socket":
                import socket
                # Bound by its relative name from inside the folder: a socket's path is limited to
                # about 107 bytes, and the staging folder's absolute path can be longer.
                here = os.getcwd()
                os.chdir(output_path)
                try:
                    socket.socket(socket.AF_UNIX).bind("special")
                finally:
                    os.chdir(here)
            else:
                os.symlink({"zero": "/dev/zero", "dangling": "/nowhere/at/all", "outside": "/etc/hostname",
                            "folder": "/tmp"}.get(kind, special), special)
        return "done"

    resources = ResourceConfig.with_cpu(max_retries_failure=1) if cluster.startswith("iris") else None
    report = StepRunner(prefix=prefix, cluster=cluster).run([StepSpec("special", make, resources=resources)],
                                                            raise_on_failure=False, force_run_failed=True)
    outcome = report.outcome_of("special")
    print("OUTCOME", outcome.outcome.name, outcome.error, flush=True)
    """
)

REFUSALS = {
    "fifo": "special is not a regular file (a FIFO)",
    "socket": "special is not a regular file (a socket)",
    "zero": "special is a link to a place outside",
    "dangling": "special is a link to nothing (/nowhere/at/all does not exist)",
    "loop": "special is a link loop",
    "outside": "special is a link to a place outside",
    "folder": "special is a link to a place outside",
}


def _run(tmp_path: Path, kind: str, cluster: str = "local") -> tuple[str, Path]:
    (tmp_path / "runner.py").write_text(RUNNER)
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    (markers / "kind").write_text(kind)
    env = {**os.environ, "IRIS_HOME": str(tmp_path / "iris-home")}
    result = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "prefix"), cluster, str(markers)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    (folder,) = [p for p in (tmp_path / "prefix").iterdir() if p.name.startswith("special-")]
    return result.stdout + result.stderr, folder


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_a_special_entry_in_the_output_is_refused_in_one_line_and_the_rerun_starts_clean(tmp_path, kind):
    log, folder = _run(tmp_path, kind)
    (outcome,) = [line for line in log.splitlines() if line.startswith("OUTCOME")]
    assert outcome.startswith("OUTCOME FAILED IrregularOutputError: ") and REFUSALS[kind] in outcome, log[-3000:]
    assert "Traceback" not in outcome and "data.txt" not in outcome and "latest" not in outcome  # only what is refused
    status = read_status(str(folder))
    assert status.status == "FAILED" and REFUSALS[kind] in status.error
    assert not (folder / "data.txt").exists() and not (folder / ".output_checksums.json").exists()  # nothing committed

    # The fixed step runs again: in a staging folder of its own, so its link is not made twice.
    log, folder = _run(tmp_path, kind)
    assert "OUTCOME RAN" in log, log[-3000:]
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["data.txt", "latest"]
    assert os.readlink(folder / "latest") == "data.txt"
    assert "FileExistsError" not in log
    checksums = json.loads((folder / ".output_checksums.json").read_text())["files"]
    assert sorted(checksums) == ["data.txt", "latest"]


def test_an_iris_retry_of_a_refused_commit_starts_from_a_clean_staging_folder(tmp_path):
    # The first attempt leaves a FIFO and a link; iris retries it (max_retries_failure=1) in the same
    # execution, which must not trip over the link the first attempt made, nor commit its FIFO.
    log, folder = _run(tmp_path, "fifo", cluster="iris:local")
    assert "OUTCOME RAN" in log, log[-4000:]
    first, second = (folder / ".attempts" / name / "replica-000.log" for name in ("001", "002"))
    assert "IrregularOutputError: " in first.read_text() and "Traceback" not in first.read_text()
    assert "attempt 2 starts from a clean staging folder" in second.read_text()
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["data.txt", "latest"]
    status = read_status(str(folder))
    assert status.status == "SUCCESS" and status.generation == 1
