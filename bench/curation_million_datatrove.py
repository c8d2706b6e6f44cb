"""The datatrove peer of bench/curation_million.py: the same stages, datatrove's way, timed alike.

    /tmp/dtvenv/bin/python bench/curation_million_datatrove.py --output OUT [--lid-model lid.176.ftz] FILE...

Run with the python of a venv of its own (``pip install 'datatrove[processing]' spacy orjson``: its
English word tokenizer loads spaCy, its jsonl reader orjson), never ours, so that neither's
packages disturb the other. Each stage is one ``LocalPipelineExecutor``
run over the input files (one task per file, ``--workers`` processes), reading the previous
stage's output, as our steps read theirs:

* language: ``LanguageFilter(languages=["en"], language_threshold=0.65)`` with fastText's lid.176
  (given ``--lid-model``, the same file our language step reads; otherwise datatrove downloads
  ``lid.176.bin``, which fails offline);
* quality: ``C4QualityFilter`` (its defaults: lines without terminal punctuation or under 3 words
  dropped, at least 5 sentences), then ``GopherRepetitionFilter`` and ``GopherQualityFilter``;
* fuzzy-dedup: datatrove's four MinHash stages with our shape (word 5-grams, 18 bands of 7 rows).
  Datatrove does not verify candidate pairs by signature agreement; ours does.

Before each stage it prints ``STAGE <name>`` (the benchmark charges the memory it samples to that
stage); the last line is ``RESULT {json}``: per stage, documents in and out, seconds, documents/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time


def count_documents(folder: str) -> int:
    import gzip

    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".jsonl.gz"):
                with gzip.open(os.path.join(root, name), "rt") as handle:
                    total += sum(1 for _ in handle)
    return total


def local_lid(path: str, languages: list[str]):
    """datatrove's fastText identifier, reading a model file that is already here (no download)."""
    from datatrove.utils.lid import FT176LID
    from fasttext.FastText import _FastText

    class LocalFT176(FT176LID):
        @property
        def model(self):
            if self._model is None:
                self._model = _FastText(path)
            return self._model

    return LocalFT176(languages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--output", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lid-model", default=None)
    args = parser.parse_args()

    from importlib.metadata import version

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter, GopherRepetitionFilter, LanguageFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    out = args.output
    shutil.rmtree(out, ignore_errors=True)
    folder = os.path.dirname(os.path.abspath(args.files[0]))
    names = sorted(os.path.basename(f) for f in args.files)
    tasks = len(names)

    def reader(where: str):
        return JsonlReader(where, glob_pattern="*.jsonl.gz")

    def run(name: str, pipeline: list, tasks: int = tasks) -> float:
        print(f"STAGE {name}", flush=True)
        began = time.perf_counter()
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=args.workers, logging_dir=f"{out}/logs/{name}").run()
        return time.perf_counter() - began

    language = LanguageFilter(languages=["en"], language_threshold=0.65)
    if args.lid_model:
        language.model = local_lid(args.lid_model, ["en"])
    stages = []
    documents_in = sum(1 for _ in _lines(args.files))
    seconds = run("language", [reader(folder), language, JsonlWriter(f"{out}/language")])
    stages.append(("language", documents_in, count_documents(f"{out}/language"), seconds))

    seconds = run("quality", [reader(f"{out}/language"), C4QualityFilter(), GopherRepetitionFilter(),
                              GopherQualityFilter(), JsonlWriter(f"{out}/quality")])
    stages.append(("quality", stages[-1][2], count_documents(f"{out}/quality"), seconds))

    config = MinhashConfig(n_grams=5, num_buckets=18, hashes_per_bucket=7)
    began = time.perf_counter()
    print("STAGE fuzzy-dedup", flush=True)
    for stage_name, pipeline, stage_tasks in (
        ("signatures", [reader(f"{out}/quality"), MinhashDedupSignature(f"{out}/minhash/sigs", config=config)], tasks),
        ("buckets", [MinhashDedupBuckets(f"{out}/minhash/sigs", f"{out}/minhash/buckets", config=config)], config.num_buckets),
        ("clusters", [MinhashDedupCluster(f"{out}/minhash/buckets", f"{out}/minhash/remove_ids", config=config)], 1),
        ("filter", [reader(f"{out}/quality"), MinhashDedupFilter(f"{out}/minhash/remove_ids"),
                    JsonlWriter(f"{out}/fuzzy")], tasks),
    ):
        LocalPipelineExecutor(pipeline, tasks=stage_tasks, workers=args.workers,
                              logging_dir=f"{out}/logs/minhash-{stage_name}").run()
    stages.append(("fuzzy-dedup", stages[-1][2], count_documents(f"{out}/fuzzy"), time.perf_counter() - began))
    scratch = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(f"{out}/minhash") for n in ns)

    rows = [{"stage": name, "documents_in": n_in, "documents_out": n_out, "seconds": round(s, 1),
             "documents_per_s": round(n_in / s)} for name, n_in, n_out, s in stages]
    rows[-1]["scratch_on_disk_mib"] = round(scratch / 2**20, 1)
    print("RESULT " + json.dumps({"version": version("datatrove"), "workers": args.workers, "stages": rows,
                                  "lid_model": args.lid_model or "downloaded lid.176.bin"}), flush=True)


def _lines(files):
    import gzip

    for path in files:
        with gzip.open(path, "rt") as handle:
            yield from handle


if __name__ == "__main__":
    main()
