"""Fuzzy dedup throughput: the MinHash dedup step against datasketch's MinHash + MinHashLSH.

Both run in this process on the same documents, alternating ``--repeat`` times (medians reported), (stories from ``storygen`` plus planted near
duplicates), with the same shingles (word 5-grams of the normalised text), ``num_perm``, threshold
and LSH bands/rows, and both verify candidates by estimated Jaccard >= threshold and join verified
pairs into clusters.

* ours: :func:`marin.curation.dedup_steps.fuzzy_deduplicated` end to end through a ``StepRunner``:
  reading jsonl, signatures, band buckets through ``group_by``, sharded connected components, and
  writing every document with its attributes as jsonl.zst.
* datasketch: ``MinHash.bulk`` over the same shingle sets, ``MinHashLSH.insert`` then ``query`` per
  document, ``MinHash.jaccard`` on each candidate, a union-find over verified pairs (texts already in
  memory, nothing written).

Usage: ``python bench/dedup_throughput.py [--docs 10000] [--repeat 3] [--backend inline]``. The last line printed is
one JSON object; the target is ``ratio >= 1.0``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import zstandard
from datasketch import MinHash, MinHashLSH
from marin.curation.dedup.minhash import shingles
from marin.curation.dedup_steps import FuzzyDedupConfig, fuzzy_deduplicated
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from storygen import generate_stories


def corpus(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(id, text): ``count`` documents, a tenth of them near duplicates (2% of words replaced)."""
    rng = random.Random(seed)
    originals = generate_stories(count - count // 10, seed=seed)
    docs = [(f"doc-{i:06d}", t) for i, t in enumerate(originals)]
    for n in range(count // 10):
        words = rng.choice(originals).split()
        for k in rng.sample(range(len(words)), max(1, len(words) // 50)):
            words[k] = "pebble"
        docs.append((f"near-{n:06d}", " ".join(words)))
    return docs


def run_ours(docs, config: FuzzyDedupConfig, backend: str, folder: Path) -> tuple[float, dict[str, str]]:
    data = folder / "input"
    data.mkdir(parents=True)
    for f in range(4):
        with open(data / f"part-{f}.jsonl", "w") as handle:
            handle.writelines(json.dumps({"id": doc_id, "text": text}) + "\n" for doc_id, text in docs[f::4])
    step = fuzzy_deduplicated("bench/fuzzy", str(data), config=config, backend=backend)
    runner = StepRunner(prefix=str(folder / "prefix"))
    start = time.perf_counter()
    runner.run([step])
    elapsed = time.perf_counter() - start
    clusters = {}
    for path in load_artifact(runner.output_path_for(step)).result["files"]:
        with open(path, "rb") as handle:
            text = zstandard.ZstdDecompressor().stream_reader(handle).read().decode()
        for line in text.splitlines():
            record = json.loads(line)
            clusters[record["id"]] = record["cluster"]
    return elapsed, clusters


def run_datasketch(docs, config: FuzzyDedupConfig, bands: int, rows: int) -> tuple[float, dict[str, str]]:
    start = time.perf_counter()
    shingle_sets = [[s.encode("utf-8") for s in shingles(text, config.ngram, config.shingle)] for _, text in docs]
    hashes = MinHash.bulk(shingle_sets, num_perm=config.num_perm, seed=config.seed)
    lsh = MinHashLSH(threshold=config.threshold, num_perm=config.num_perm, params=(bands, rows))
    for (doc_id, _), minhash in zip(docs, hashes):
        lsh.insert(doc_id, minhash)
    index = {doc_id: i for i, (doc_id, _) in enumerate(docs)}
    parent = {doc_id: doc_id for doc_id, _ in docs}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (doc_id, _), minhash in zip(docs, hashes):
        for other in lsh.query(minhash):
            if other != doc_id and minhash.jaccard(hashes[index[other]]) >= config.threshold:
                a, b = root(doc_id), root(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    elapsed = time.perf_counter() - start
    return elapsed, {doc_id: root(doc_id) for doc_id, _ in docs}


def pair_agreement(left: dict[str, str], right: dict[str, str]) -> tuple[int, int, int]:
    """(pairs clustered together by both, only by the left, only by the right)."""
    def pairs(clusters):
        groups: dict[str, list[str]] = {}
        for doc, label in clusters.items():
            groups.setdefault(label, []).append(doc)
        return {(a, b) for g in groups.values() for i, a in enumerate(sorted(g)) for b in sorted(g)[i + 1:]}
    x, y = pairs(left), pairs(right)
    return len(x & y), len(x - y), len(y - x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=10000)
    parser.add_argument("--backend", default="inline")
    parser.add_argument("--threshold", type=float, default=0.7)
    parser.add_argument("--num-perm", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = FuzzyDedupConfig(threshold=args.threshold, num_perm=args.num_perm)
    bands, rows = config.lsh()
    docs = corpus(args.docs)
    ds_times, our_times = [], []
    for _ in range(args.repeat):  # alternating, so both see the same load on a shared machine
        elapsed, ds_clusters = run_datasketch(docs, config, bands, rows)
        ds_times.append(elapsed)
        with tempfile.TemporaryDirectory() as folder:
            elapsed, our_clusters = run_ours(docs, config, args.backend, Path(folder))
        our_times.append(elapsed)
    ds_time, our_time = statistics.median(ds_times), statistics.median(our_times)
    both, only_ours, only_datasketch = pair_agreement(our_clusters, ds_clusters)
    report = {
        "documents": len(docs), "num_perm": config.num_perm, "threshold": config.threshold,
        "bands": bands, "rows": rows, "backend": args.backend,
        "ours_docs_per_s": round(len(docs) / our_time, 1),
        "datasketch_docs_per_s": round(len(docs) / ds_time, 1),
        "ratio": round(ds_time / our_time, 2),
        "same_clusters": only_ours == only_datasketch == 0,
        "duplicate_pairs_both": both, "pairs_only_ours": only_ours, "pairs_only_datasketch": only_datasketch,
    }
    print(f"ours {report['ours_docs_per_s']} docs/s, datasketch {report['datasketch_docs_per_s']} docs/s, "
          f"ratio {report['ratio']}x; same clusters: {report['same_clusters']}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
