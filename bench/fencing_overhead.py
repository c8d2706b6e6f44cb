"""What fenced step ownership costs: a step's claim and commit, and a training step's checkpoints.

    python bench/fencing_overhead.py [--steps 20] [--files 200] [--file-kib 64]
    python bench/side_by_side.py --base <revision before fencing> bench/fencing_overhead.py

Fencing adds, per step, a conditional claim of the status record, conditional status writes, and a
commit that moves the staged output into the step folder (one rename per top-level entry on local
disk; a server-side copy of every file, then the deletes, on an object store). Per checkpoint it
adds nothing: checkpoints are written into the execution's staging folder and move with the rest.
This measures, on a local prefix and on an S3 prefix served by moto in this process (when moto is
installed; a stand-in for the request count, not for a real store's speed):

* ``trivial_step_s``: the median wall time of a step that writes one small file;
* ``wide_step_s``: the median wall time of a step that writes ``--files`` files of ``--file-kib`` KiB
  in ``--files / 20`` folders (the commit moves them);
* ``rerun_step_s``: the median wall time of a step run again after its first execution failed,
  leaving ``--files`` files in its staging folder: the fence ends what of the old execution may
  still run (a look at its replicas' heartbeats), and the new one starts from a clean folder,
  taking over only resumable state (before: it continued in the old folder);
* ``train_step_s``: one tiny training step (20 updates, a checkpoint every 5) on a local prefix;
* ``special_file_check_us_per_file`` (this tree only: the check is new), beside
  ``checksum_us_per_file``: what the commit's walk refusing special files and links out of the
  output costs per file of the wide step's output, and what hashing the same files costs.

The last line printed is one JSON object with the figures; ``bench/side_by_side.py`` runs it
against an earlier revision, so both columns come from the same machine at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from unittest import mock

from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec
from rigging import filesystem as fsx
from rigging.log import setup_logging


def trivial(output_path: str) -> int:
    fsx.atomic_write(fsx.join(output_path, "done.txt"), "done")
    return 1


def wide(output_path: str, files: int, file_kib: int) -> int:
    payload = os.urandom(file_kib * 1024)
    for index in range(files):
        fsx.atomic_write(fsx.join(output_path, f"part-{index % max(1, files // 20):03d}", f"file-{index:05d}.bin"), payload)
    return files


def fails_once(output_path: str, files: int, file_kib: int, marker: str) -> int:
    """Writes the wide output, and fails the first time (its staging folder keeps the files)."""
    wide(output_path, files, file_kib)
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("the first execution fails")
    return files


def median_rerun_seconds(prefix: str, steps: int, files: int, file_kib: int) -> float:
    times = []
    for index in range(steps):
        marker = os.path.join(tempfile.mkdtemp(prefix="fencing-bench-marker-"), "failed-once")
        step = StepSpec(f"bench/rerun-{index}", lambda output_path: fails_once(output_path, files, file_kib, marker),
                        hash_attrs={"index": index, "files": files})
        StepRunner(prefix=prefix).run([step], raise_on_failure=False)
        started = time.perf_counter()
        StepRunner(prefix=prefix).run([step], force_run_failed=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def check_and_checksum_us_per_file(files: int, file_kib: int, repeats: int = 20) -> dict[str, float]:
    """The commit's special-file walk and its hashing, per file of a wide output (the walk is new)."""
    try:
        from rigging.regular_files import refused_entries
    except ImportError:
        return {}
    from zephyr.output_checksums import write_checksums

    folder = tempfile.mkdtemp(prefix="fencing-bench-check-")
    wide(folder, files, file_kib)

    def per_file(call) -> float:
        started = time.perf_counter()
        for _ in range(repeats):
            call()
        return (time.perf_counter() - started) / repeats / files * 1e6

    assert refused_entries(folder) == []
    return {"special_file_check_us_per_file": per_file(lambda: refused_entries(folder)),
            "checksum_us_per_file": per_file(lambda: write_checksums(folder))}


def median_step_seconds(prefix: str, name: str, fn, steps: int, **attrs) -> float:
    times = []
    for index in range(steps):
        step = StepSpec(f"bench/{name}-{index}", fn, hash_attrs={"index": index, **attrs})
        started = time.perf_counter()
        StepRunner(prefix=prefix).run([step])
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def train_seconds(prefix: str) -> float:
    """One tiny training step with checkpoints, tokenizing first (not timed)."""
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
    from marin.execution.lazy import lower
    from marin.experiment.data import tokenized
    from marin.experiment.train import train_lm

    texts = [f"Once upon a time a fox number {i} found a red ball and a blue cup by the river." for i in range(400)]
    data_folder = tempfile.mkdtemp(prefix="fencing-bench-data-")
    with open(os.path.join(data_folder, "train.jsonl"), "w") as handle:
        handle.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    save_tokenizer(train_bpe_tokenizer(texts, 300), os.path.join(data_folder, "tokenizer"))
    data = tokenized("tokenized/bench", os.path.join(data_folder, "train.jsonl"), os.path.join(data_folder, "tokenizer"))
    StepRunner(prefix=prefix).run(lower(data))
    model = train_lm(
        name="checkpoints/bench",
        model=LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=64),
        optimizer=AdamConfig(learning_rate=1e-3), datasets={data: 1.0}, batch_size=4, seq_len=64, num_train_steps=20,
        steps_per_checkpoint=5, minutes_per_checkpoint=None, num_samples=0,
    )
    started = time.perf_counter()
    StepRunner(prefix=prefix).run(lower(model))
    return time.perf_counter() - started


@contextlib.contextmanager
def moto_prefix() -> Iterator[str | None]:
    """An ``s3://`` prefix on a moto server of this process, or None when moto is not installed."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield None
        return
    import boto3

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_ENDPOINT_URL": endpoint,
                   "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        with mock.patch.dict(os.environ, credentials):  # restored on the way out
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="fencing-bench")
            yield "s3://fencing-bench/prefix"
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--file-kib", type=int, default=64)
    parser.add_argument("--no-train", action="store_true", help="skip the training step (it compiles a model)")
    args = parser.parse_args()
    setup_logging("WARNING")
    logging.getLogger("marin").setLevel(logging.WARNING)

    figures: dict[str, float] = {}
    local = tempfile.mkdtemp(prefix="fencing-bench-")
    figures["local_trivial_step_s"] = median_step_seconds(local, "trivial", trivial, args.steps)
    figures["local_wide_step_s"] = median_step_seconds(
        local, "wide", lambda output_path: wide(output_path, args.files, args.file_kib), max(3, args.steps // 4),
        files=args.files)
    figures["local_rerun_step_s"] = median_rerun_seconds(local, max(3, args.steps // 4), args.files, args.file_kib)
    figures.update(check_and_checksum_us_per_file(args.files, args.file_kib))
    with moto_prefix() as s3:
        if s3 is not None:
            figures["s3_trivial_step_s"] = median_step_seconds(s3, "trivial", trivial, max(3, args.steps // 2))
            figures["s3_wide_step_s"] = median_step_seconds(
                s3, "wide", lambda output_path: wide(output_path, args.files, args.file_kib), 3, files=args.files)
    if not args.no_train:
        figures["local_train_step_s"] = train_seconds(tempfile.mkdtemp(prefix="fencing-bench-train-"))
    for name, value in figures.items():
        print(f"{name:32s} {value:8.3f}")
    print(json.dumps({name: round(value, 4) for name, value in figures.items()}))


if __name__ == "__main__":
    main()
