"""Peak memory of a fuzzy dedup worker as its shard grows, beside datatrove's MinHash stages on the same input.

One input shard of ``N`` small documents (4 to 8 sentences drawn from the TinyStories sample in
``../shared/data``, about 300 characters; a tenth are near copies of a recent document with one
word changed) is deduplicated with the defaults (128 permutations, word 5-grams, 18 bands of 7
rows, threshold 0.7). Each worker of the fuzzy step runs alone in a fresh process, on one shard,
and reports its peak resident set (``ru_maxrss``) and time:

* ``signatures``: reads the shard, signs it, writes its document table and sorted runs of band entries;
* ``buckets``: merges the runs of its key partition (here the only one), verifies each bucket, writes edges;
* ``components``: label propagation over the edges, decisions written as sorted runs per file;
* ``join``: the shard's documents streamed past their decisions, written as jsonl.zst.

``imports`` is a process that only imports what the workers import: the floor under every figure.
With ``--datatrove`` (a Python with datatrove installed, kept apart from this environment), its four
MinHash stages run the same way on the same file: word 5-grams (words split as ours, ``\\w+``, not
by its default spaCy tokenizer), 18 buckets of 7 hashes (64-bit), one task; the bucket stage is
rank 0 of 18 (it takes one task per bucket).

Usage: ``python bench/dedup_memory.py [--docs 100000 300000] [--datatrove /tmp/dtvenv/bin/python]``.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tinystories" / "train.jsonl"
OUR_STAGES = ("imports", "signatures", "buckets", "components", "join")
DATATROVE_STAGES = ("imports", "signatures", "buckets", "cluster", "filter")
STAGE_TIMEOUT_S = 3600


def write_corpus(path: Path, count: int, seed: int = 0) -> None:
    """``count`` documents streamed to ``path``; near copies pick from the last 1,000 originals."""
    with open(SAMPLE) as handle:
        stories = [json.loads(line)["text"] for line in handle]
    sentences = [s.strip() + "." for story in stories for s in story.replace("\n", " ").split(".") if len(s.split()) > 3]
    rng = random.Random(seed)
    recent: list[str] = []
    with open(path, "w") as out:
        for i in range(count):
            if recent and rng.random() < 0.1:
                words = rng.choice(recent).split()
                words[rng.randrange(len(words))] = "pebble"
                text = " ".join(words)
            else:
                text = " ".join(rng.choice(sentences) for _ in range(rng.randint(4, 8)))
                recent = [*recent[-999:], text]
            out.write(json.dumps({"id": f"doc-{i:07d}", "text": text}) + "\n")


# -- the workers, each run in its own process ----------------------------------------------------


def run_ours(stage: str, data: str, work: str) -> float:
    from marin.curation.dedup.buckets import BandKeys, BucketEdges
    from marin.curation.dedup.join import DecisionRuns, joined_dataset
    from marin.curation.dedup.keyed import GroupShard, SpillShard
    from marin.curation.dedup.components import component_decisions
    from marin.curation.dedup.records import file_sources
    from marin.curation.dedup.spill import SpillSettings
    from marin.curation.dedup_steps import FuzzyDedupConfig
    from marin.curation.steps import CurationSink, write_curated

    config, settings = FuzzyDedupConfig(), SpillSettings()
    bands, rows = config.lsh()
    [source] = file_sources([data], "text", "id")
    started = time.perf_counter()
    if stage == "signatures":
        for _ in SpillShard(source, BandKeys(config.minhash(), bands, rows), f"{work}/buckets", 1, settings)():
            pass
    elif stage == "buckets":
        os.makedirs(f"{work}/edges", exist_ok=True)
        with open(f"{work}/edges/part-00000.jsonl", "w") as out:
            for edge in GroupShard(f"{work}/buckets", 0, BucketEdges(config.threshold), 2, config.num_perm, settings)():
                out.write(json.dumps(edge) + "\n")
    elif stage == "components":
        decisions, _ = component_decisions([f"{work}/edges/part-00000.jsonl"], f"{work}/components", "inline", 1,
                                           settings)
        decisions.map_shard(DecisionRuns(f"{work}/runs", settings.record_buffer)).write_jsonl(
            f"{work}/summary/part-{{shard:05d}}.jsonl", backend="inline")
    elif stage == "join":
        sink = CurationSink(f"{work}/out", "jsonl", "mark", "text")
        result = write_curated(joined_dataset([source], f"{work}/runs", None), sink, backend="inline")
        print(json.dumps({"near_duplicates": result.summary["marked"].get("near-duplicate", {}).get("documents", 0)}))
    return time.perf_counter() - started


def run_datatrove(stage: str, data: str, work: str) -> float:
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.data import Document
    from datatrove.utils.hashing import HashConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Words(WordTokenizer):
        """Words as ours finds them (``\\w+``), instead of its default spaCy English tokenizer, the slowest part of its run here."""

        def word_tokenize(self, text: str) -> list[str]:
            return re.findall(r"\w+", text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [m.span() for m in re.finditer(r"\w+", text)]

    config = MinhashConfig(hash_config=HashConfig(precision=64), num_buckets=18, hashes_per_bucket=7, n_grams=5)

    def documents():  # the standard library's json, as ours reads (datatrove's own reader wants orjson)
        with open(data) as handle:
            for line in handle:
                record = json.loads(line)
                yield Document(text=record["text"], id=record["id"])

    def drain(output):
        for _ in output or ():
            pass

    started = time.perf_counter()
    if stage == "signatures":
        drain(MinhashDedupSignature(f"{work}/sigs", config=config, language=Words()).run(documents(), 0, 1))
    elif stage == "buckets":
        drain(MinhashDedupBuckets(f"{work}/sigs", f"{work}/buckets", config=config).run(None, 0, 18))
    elif stage == "other-buckets":  # ranks 1 to 17, unmeasured: the cluster stage needs every bucket's pairs
        for rank in range(1, 18):
            drain(MinhashDedupBuckets(f"{work}/sigs", f"{work}/buckets", config=config).run(None, rank, 18))
    elif stage == "cluster":
        drain(MinhashDedupCluster(f"{work}/buckets", f"{work}/remove", config=config).run(None, 0, 1))
    elif stage == "filter":
        kept = MinhashDedupFilter(f"{work}/remove").run(documents(), 0, 1)
        os.makedirs(f"{work}/out", exist_ok=True)
        with open(f"{work}/out/part-0.jsonl", "w") as out:
            out.writelines(json.dumps({"id": doc.id, "text": doc.text}) + "\n" for doc in kept)
    return time.perf_counter() - started


def worker_main(kind: str, stage: str, data: str, work: str) -> None:
    seconds = (run_ours if kind == "ours" else run_datatrove)(stage, data, work)
    if stage != "other-buckets":
        print(json.dumps({"seconds": round(seconds, 2),
                          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def measure(python: str, kind: str, stage: str, data: Path, work: Path) -> dict:
    if stage == "imports":
        stage_code = ("import resource, json; import marin.curation.dedup_steps, marin.curation.dedup.keyed, "
                      "marin.curation.dedup.join" if kind == "ours" else
                      "import resource, json; import datatrove.pipeline.dedup.minhash, datatrove.data")
        command = [python, "-c", stage_code + "; print(json.dumps({'seconds': 0, 'peak_rss_mb': "
                   "round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))"]
    else:
        command = [python, __file__, "--worker", kind, stage, str(data), str(work)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=STAGE_TIMEOUT_S)
    if kind == "datatrove" and stage == "buckets" and done.returncode == 0:
        subprocess.run([python, __file__, "--worker", kind, "other-buckets", str(data), str(work)],
                       capture_output=True, check=True, timeout=STAGE_TIMEOUT_S)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, nargs="+", default=[100_000, 300_000])
    parser.add_argument("--datatrove", default="/tmp/dtvenv/bin/python",
                        help="a Python with datatrove installed ('none': skip it); measured on the first --docs only")
    parser.add_argument("--scratch", default=None, help="folder for the corpus and the workers' files")
    args = parser.parse_args()
    report: dict = {"ours": {}, "datatrove": {}}
    datatrove = args.datatrove if args.datatrove != "none" and os.path.exists(args.datatrove) else None
    for index, count in enumerate(args.docs):
        folder = Path(tempfile.mkdtemp(prefix="dedup-memory-", dir=args.scratch))
        try:
            data = folder / "data" / "part-0.jsonl"
            data.parent.mkdir()
            write_corpus(data, count)
            figures = report["ours"][count] = {stage: measure(sys.executable, "ours", stage, data, folder / "ours")
                                               for stage in OUR_STAGES}
            print(f"ours, {count:,} documents: " + ", ".join(
                f"{stage} {f.get('peak_rss_mb')} MB in {f.get('seconds')} s" for stage, f in figures.items()), flush=True)
            if index == 0 and datatrove:
                figures = report["datatrove"][count] = {
                    stage: measure(datatrove, "datatrove", stage, data, folder / "datatrove") for stage in DATATROVE_STAGES}
                print(f"datatrove, {count:,} documents: " + ", ".join(
                    f"{stage} {f.get('peak_rss_mb')} MB in {f.get('seconds')} s" for stage, f in figures.items()),
                    flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if args.datatrove == "none":
        report["datatrove"] = "not measured (--datatrove none)"
        print(report["datatrove"])
    elif not datatrove:
        report["datatrove"] = f"not measured: no Python at {args.datatrove} (install datatrove there, apart from this environment)"
        print(report["datatrove"])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
