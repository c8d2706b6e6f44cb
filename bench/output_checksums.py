"""What output checksums cost: recording them when a step commits, checking them when a step reads.

    python bench/output_checksums.py                        # 200 shards of 1 MiB and 3 files of 64 MiB
    python bench/output_checksums.py --shards 500 --large-mb 256 --dir /mnt/disk/tmp

A step writes ``--shards`` jsonl.zst shards of about 1 MiB each (random words) and ``--large``
plain jsonl files of ``--large-mb``; a second step reads every record of every file through zephyr's
readers. Both steps run under the StepRunner on local disk, with checksums as shipped and with them
turned off (the manifest writer and the readers' check replaced by no-ops), in the same process and
on the same files' sizes; each figure is the best of ``--repeats`` alternating runs, so both sides
see a warm page cache. Also printed: the manifest writing alone and the whole-folder check alone
(what ``marin reproduce`` adds). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import zephyr.readers
from marin.execution.ownership import step_ownership
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from rigging import filesystem as fsx
from zephyr.output_checksums import changed_files, write_checksums
from zephyr.readers import read_jsonl
from zephyr.writers import write_jsonl_file

MIB = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=200)
    p.add_argument("--large", type=int, default=3)
    p.add_argument("--large-mb", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", default=None, help="parent folder on the disk to measure (default: the system temp dir)")
    return p.parse_args()


def _words(rng: random.Random, nbytes: int) -> str:
    """Letters in words: compresses about as well as text that was already deduplicated."""
    raw = base64.b32encode(rng.randbytes(nbytes * 5 // 8)).decode().lower()
    return " ".join(raw[i:i + 7] for i in range(0, len(raw), 7))


def make_corpus(folder: Path, shards: int, large: int, large_mb: int) -> Path:
    """The files the first step will copy into its output (made once, outside any step)."""
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for index in range(shards):
        # About 1.6 MiB of words compress to about 1 MiB.
        records = ({"id": f"{index}-{i}", "text": _words(rng, 16 << 10)} for i in range(100))
        write_jsonl_file(str(folder / f"part-{index:05d}.jsonl.zst"), records)
    for index in range(large):
        with open(folder / f"large-{index}.jsonl", "w") as handle:
            written = 0
            while written < large_mb * MIB:
                line = json.dumps({"text": _words(rng, 64 << 10)}) + "\n"
                handle.write(line)
                written += len(line)
    return folder


@contextmanager
def checksums_off():
    """The manifest writer and the readers' check as no-ops: the engine as it was without them."""
    write, check = step_ownership.write_checksums, zephyr.readers.check_recorded_checksum
    step_ownership.write_checksums = lambda folder: {}
    zephyr.readers.check_recorded_checksum = lambda path, handle=None: None
    try:
        yield
    finally:
        step_ownership.write_checksums, zephyr.readers.check_recorded_checksum = write, check


def run_pair(corpus: Path, prefix: Path) -> tuple[float, float, str]:
    """(seconds to run the writing step, seconds to run the reading step, the writing step's folder)."""
    names = sorted(p.name for p in corpus.iterdir())

    def write(ctx) -> dict:
        files = []
        for name in names:  # a copy, as a step writes its shards; the commit is what is measured
            url = fsx.join(ctx.output_path, "data", name)
            fsx.makedirs(fsx.join(ctx.output_path, "data"))
            os.link(corpus / name, url)
            files.append(url)
        return {"files": files}

    writer = lazy_step("bench/write", write)

    def read(ctx) -> dict:
        files = ctx.load_artifact(writer).result["files"]
        return {"records": sum(1 for path in files for _ in read_jsonl(path))}

    reader = lazy_step("bench/read", read, deps=[writer])
    runner = StepRunner(prefix=str(prefix))
    started = time.perf_counter()
    runner.run([writer])
    wrote = time.perf_counter() - started
    started = time.perf_counter()
    runner.run([reader])
    return wrote, time.perf_counter() - started, runner.output_path_for(writer)


def main() -> None:
    args = parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-output-checksums-", dir=args.dir))
    corpus = make_corpus(root / "corpus", args.shards, args.large, args.large_mb)
    total = sum(p.stat().st_size for p in corpus.iterdir())
    print(f"{args.shards} shards of ~{sum(p.stat().st_size for p in corpus.glob('*.zst')) / max(args.shards, 1) / MIB:.2f} "
          f"MiB and {args.large} files of {args.large_mb} MiB: {total / MIB:.0f} MiB in all, under {root}")
    runs: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
    folder = ""
    for repeat in range(args.repeats):
        for mode in ("without", "with"):
            prefix = root / f"{mode}-{repeat}"
            if mode == "without":
                with checksums_off():
                    wrote, read, _ = run_pair(corpus, prefix)
            else:
                wrote, read, folder = run_pair(corpus, prefix)
            runs[mode].append((wrote, read))
    best = {mode: (min(w for w, _ in pairs), min(r for _, r in pairs)) for mode, pairs in runs.items()}

    started = time.perf_counter()
    write_checksums(folder)
    manifest_s = time.perf_counter() - started
    started = time.perf_counter()
    assert changed_files(folder) == []
    check_s = time.perf_counter() - started

    rate = total / MIB
    print(f"writing step (commit included): {best['without'][0]:.2f} s without checksums, {best['with'][0]:.2f} s with")
    print(f"reading step (every record):    {best['without'][1]:.2f} s without checksums, {best['with'][1]:.2f} s with")
    print(f"the manifest alone: {manifest_s:.2f} s ({rate / manifest_s:.0f} MiB/s); "
          f"checking the whole folder (marin reproduce): {check_s:.2f} s ({rate / check_s:.0f} MiB/s)")
    fsx.rm(str(root), recursive=True)
    print(json.dumps({
        "shards": args.shards, "large_files": args.large, "large_mb": args.large_mb, "total_mib": round(rate, 1),
        "write_step_s": {"without": round(best["without"][0], 3), "with": round(best["with"][0], 3)},
        "read_step_s": {"without": round(best["without"][1], 3), "with": round(best["with"][1], 3)},
        "manifest_s": round(manifest_s, 3), "check_folder_s": round(check_s, 3),
    }))


if __name__ == "__main__":
    main()
