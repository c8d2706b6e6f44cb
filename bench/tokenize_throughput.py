"""Tokenize throughput: the whole tokenize pipeline against raw ``tokenizers`` ``encode_batch``.

Both run in this process, on the same cores, over the same documents (by default the shared
TinyStories sample with the GPT-2 tokenizer), alternating ``--repeat`` times; the median of each is
reported.

* raw: ``Tokenizer.encode_batch(texts)`` on texts already in memory (the tokenizer already loaded).
* pipeline: :func:`marin.processing.tokenize.run_tokenize` end to end into a fresh folder: loading
  the tokenizer and its identity, reading the jsonl, encoding, writing the token cache and ledger.

``--data`` may name several files: a glob, or a folder of shards such as a curation step's
``data/`` (found as every data step finds its input, ``zephyr.readers.expand_input_files``). The
pipeline then makes one cache shard per file, and the raw side encodes the same texts a batch at a
time (``ENCODE_BATCH_CHARS`` characters, the pipeline's own batch, from the step's own
``batches_by_chars``), since one call over a whole corpus would hold every ``Encoding`` in memory.

Both rates count content tokens (without the appended EOS). Each run's CPU time (all threads and
child processes of this process) is reported too: on a shared machine the wall times say as much
about the neighbours as about the code, while the CPU seconds per token say what the work costs.
Usage: ``python bench/tokenize_throughput.py [--data FILE|GLOB|FOLDER] [--tokenizer PATH] [--repeat 3]
[--backend inline]``. The last line printed is one JSON object; the target is ``ratio >= 0.95``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tokenizers

from marin.processing.tokenize import ENCODE_BATCH_CHARS, TokenizeConfig, TokenizeInputs, batches_by_chars, run_tokenize
from zephyr.readers import DocumentReader, expand_input_files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_sampler import tree_cpu_seconds  # noqa: E402

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(SHARED / "data" / "tinystories" / "train.jsonl"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2" / "tokenizer.json"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default=None, help="zephyr backend for the pipeline (default: the step's choice)")
    args = parser.parse_args()

    files = expand_input_files(args.data)
    texts = [text for path in files for text in DocumentReader()(path)]
    batches = list(batches_by_chars(iter(texts), ENCODE_BATCH_CHARS)) if len(files) > 1 else [texts]
    raw_tokenizer = tokenizers.Tokenizer.from_file(args.tokenizer)
    raw_tokenizer.encode_batch(texts[:64])  # start the thread pool before timing

    config = TokenizeConfig(source={"kind": "bench"}, tokenizer=None, splits=("train",))
    inputs = TokenizeInputs(split_files={"train": files}, tokenizer=args.tokenizer)
    raw_seconds, pipeline_seconds, raw_cpu, pipeline_cpu = [], [], [], []
    raw_tokens = pipeline_tokens = 0
    scratch = tempfile.mkdtemp(prefix="tokenize-bench-")
    try:
        for i in range(args.repeat):
            # Only the encode_batch calls are timed: counting the ids and freeing the encodings are not.
            raw_tokens, seconds, cpu_used = 0, 0.0, 0.0
            for batch in batches:
                began, cpu = time.perf_counter(), cpu_seconds()
                encodings = raw_tokenizer.encode_batch(batch)
                seconds, cpu_used = seconds + time.perf_counter() - began, cpu_used + cpu_seconds() - cpu
                raw_tokens += sum(len(e.ids) for e in encodings)
                del encodings
            raw_seconds.append(seconds)
            raw_cpu.append(cpu_used)

            out = os.path.join(scratch, f"run-{i}")
            began, cpu = time.perf_counter(), cpu_seconds()
            result = run_tokenize(config, inputs, out, backend=args.backend)
            pipeline_seconds.append(time.perf_counter() - began)
            pipeline_cpu.append(cpu_seconds() - cpu)
            pipeline_tokens = result.splits["train"].content_tokens
            shutil.rmtree(out, ignore_errors=True)
            print(
                f"repeat {i + 1}/{args.repeat}: raw {raw_seconds[-1]:.3f}s ({raw_cpu[-1]:.3f}s CPU), "
                f"pipeline {pipeline_seconds[-1]:.3f}s ({pipeline_cpu[-1]:.3f}s CPU)",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    if raw_tokens != pipeline_tokens:
        raise SystemExit(f"token counts differ: raw {raw_tokens}, pipeline {pipeline_tokens}")
    raw_rate = raw_tokens / statistics.median(raw_seconds)
    pipeline_rate = pipeline_tokens / statistics.median(pipeline_seconds)
    print(
        json.dumps(
            {
                "documents": len(texts),
                "tokens": raw_tokens,
                "cpu_count": os.cpu_count(),
                "repeats": args.repeat,
                "raw_tokens_per_s": round(raw_rate),
                "pipeline_tokens_per_s": round(pipeline_rate),
                "ratio": round(pipeline_rate / raw_rate, 3),
                "raw_median_s": round(statistics.median(raw_seconds), 3),
                "pipeline_median_s": round(statistics.median(pipeline_seconds), 3),
                "raw_cpu_median_s": round(statistics.median(raw_cpu), 3),
                "pipeline_cpu_median_s": round(statistics.median(pipeline_cpu), 3),
                "cpu_ratio": round(statistics.median(raw_cpu) / statistics.median(pipeline_cpu), 3),
                # The first pipeline run also canonicalises and parses the tokenizer (later runs in the
                # same process reuse it, as a script that declares and then runs the step does).
                "pipeline_first_s": round(pipeline_seconds[0], 3),
            }
        )
    )


def cpu_seconds() -> float:
    """CPU time of this process, of its live descendants (the process pool's workers, kept warm
    between runs) and of its children that have ended."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ended.ru_utime + ended.ru_stime + tree_cpu_seconds(os.getpid())


if __name__ == "__main__":
    main()
