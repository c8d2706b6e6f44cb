"""A step rerun after its writer was SIGKILLed removes the orphan temporary files of the dead attempt,
and leaves alone the temporaries that a live writer may still own."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

from rigging import filesystem as fsx
from zephyr import Dataset

from marin.execution.records.executor_files import LOCK_FILE, STATUS_FILE
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

RECORDS = [{"id": i, "text": f"story {i}"} for i in range(10)]

# The earlier attempt: a zephyr write killed with SIGKILL in the middle of its second shard.
KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from zephyr import Dataset

    def die_at(record):
        if record["id"] == 7:
            os.kill(os.getpid(), signal.SIGKILL)
        return record

    records = [{"id": i, "text": f"story {i}"} for i in range(10)]
    Dataset.from_list(records, num_shards=2).map(die_at).write_jsonl(sys.argv[1] + "/part-{shard}.jsonl", backend="inline")
    """
)


def write_shards(output_path):
    shards = Dataset.from_list(RECORDS, num_shards=2)
    shards.write_jsonl(output_path + "/part-{shard}.jsonl", backend="inline", skip_existing=True)
    return {"shards": 2}


def _temporaries(folder):
    return sorted(
        os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs if fsx.is_temporary_name(f)
    )


def _read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_rerun_after_a_killed_zephyr_write_removes_the_orphan_and_finishes(tmp_path, caplog):
    output = str(tmp_path / "prefix" / "shards")
    os.makedirs(output)
    child = subprocess.run([sys.executable, "-c", KILLED_WRITER, output], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    orphans = _temporaries(output)
    assert len(orphans) == 1 and orphans[0].startswith(".part-1.jsonl.tmp-")

    step = StepSpec("shards", write_shards, output_path=output)
    with caplog.at_level(logging.INFO, logger="marin.execution.step_runner"):
        report = StepRunner(prefix=str(tmp_path / "prefix"), poll_s=0.05).run([step])
    assert report.ran == ["shards"]
    assert _temporaries(output) == []
    assert "removed 1 temporary file(s)" in caplog.text
    assert _read_jsonl(os.path.join(output, "part-0.jsonl")) + _read_jsonl(os.path.join(output, "part-1.jsonl")) == RECORDS


def test_temporaries_a_live_writer_may_own_are_kept(tmp_path):
    prefix = str(tmp_path / "prefix")
    output = os.path.join(prefix, "outer")
    nested_step = os.path.join(output, "inner")  # another step's output folder, with its own lease
    os.makedirs(nested_step)
    orphan = fsx.temporary_name_for(os.path.join(output, "data.bin"))
    competing_acquire = fsx.temporary_name_for(os.path.join(output, LOCK_FILE))  # another runner's try_acquire
    nested_live = fsx.temporary_name_for(os.path.join(nested_step, "shard.bin"))
    ordinary = os.path.join(output, "notes.tmp-keep")  # a user's file that merely looks temporary
    for path in (orphan, competing_acquire, nested_live, ordinary):
        with open(path, "w") as handle:
            handle.write("x")
    with open(os.path.join(nested_step, STATUS_FILE), "w") as handle:
        handle.write('{"status": "RUNNING", "time": 0}')

    seen_by_fn = []
    step = StepSpec("outer", lambda: seen_by_fn.append(sorted(os.listdir(output))), output_path=output)
    StepRunner(prefix=prefix, poll_s=0.05).run([step])
    assert not os.path.exists(orphan)
    for kept in (competing_acquire, nested_live, ordinary):
        assert os.path.exists(kept), kept
    # The orphan was gone before the step function started.
    assert os.path.basename(orphan) not in seen_by_fn[0]
