"""A step whose own output fills the disk fails, and its record says so (never RUNNING for good).

The prefix is a private 2 MiB tmpfs (mounting one needs root; elsewhere the test skips).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from marin.execution.records.executor_files import read_status
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", f"marin-test-{uuid.uuid4().hex[:8]}", str(mount_point)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def fill_the_disk(output_path):
    with open(os.path.join(output_path, "huge.bin"), "wb") as handle:
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()


def test_a_step_that_fills_the_disk_is_recorded_failed(small_disk):
    report = StepRunner(prefix=str(small_disk / "prefix"), lease_ttl_s=5, heartbeat_s=0.5).run(
        [StepSpec("filler", fill_the_disk)], raise_on_failure=False)
    outcome = report.outcome_of("filler")
    assert outcome.outcome.name == "FAILED"
    status = read_status(outcome.output_path)
    assert status is not None and status.status == "FAILED", status
    assert "No space left on device" in status.error
    # What the step wrote stays where it was staged (nothing of it is committed) for the user to look at.
    assert not (Path(outcome.output_path) / "huge.bin").exists()
