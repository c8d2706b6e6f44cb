"""Tokenize throughput into a local folder and into an S3 bucket, side by side.

The same documents (built-in TinyStories-style stories, written to a local jsonl) and the same
tokenizer (a byte-level BPE trained here) are tokenized by :func:`marin.processing.tokenize.run_tokenize`
into a fresh local folder and into a fresh bucket of a local S3 server (moto's, started by this
script), alternating ``--repeat`` times; the median of each is reported. What differs is only where
the token cache is written (shards, offsets, ledger, checksums).

Usage: ``python bench/tokenize_object_store.py [--stories 20000] [--repeat 3]``. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from rigging.local_stores import local_s3_server
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from storygen import generate_stories
from marin.processing.tokenize import TokenizeConfig, TokenizeInputs, run_tokenize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="tokenize-object-store-")
    try:
        stories = generate_stories(args.stories, seed=0)
        data = os.path.join(scratch, "train.jsonl")
        with open(data, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"text": story}) + "\n" for story in stories)
        tokenizer = save_tokenizer(train_bpe_tokenizer(stories[:2000], 4096), os.path.join(scratch, "tokenizer"))
        config = TokenizeConfig(source={"kind": "bench"}, tokenizer=None, splits=("train",))
        inputs = TokenizeInputs(split_files={"train": [data]}, tokenizer=tokenizer)
        seconds: dict[str, list[float]] = {"local": [], "s3": []}
        tokens = 0
        with local_s3_server() as store:
            os.environ.update(store.env)
            for i in range(args.repeat):
                for where in ("local", "s3"):
                    out = os.path.join(scratch, f"out-{i}") if where == "local" else store.new_bucket(f"bench-{i}") + "/tokenized"
                    began = time.perf_counter()
                    result = run_tokenize(config, inputs, out, backend="inline")
                    seconds[where].append(time.perf_counter() - began)
                    tokens = result.splits["train"].tokens
                    print(f"repeat {i + 1}/{args.repeat} {where}: {seconds[where][-1]:.2f}s", flush=True)
                shutil.rmtree(os.path.join(scratch, f"out-{i}"), ignore_errors=True)
        megabytes = tokens * 2 / 1e6  # uint16 ids for a 4,096-token vocabulary
        report = {"documents": len(stories), "tokens": tokens, "cache_mb": round(megabytes, 1), "repeats": args.repeat}
        for where, times in seconds.items():
            median = statistics.median(times)
            report[f"{where}_seconds"] = round(median, 2)
            report[f"{where}_tokens_per_second"] = round(tokens / median)
        report["s3_over_local"] = round(report["s3_seconds"] / report["local_seconds"], 2)
        print(json.dumps(report))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
