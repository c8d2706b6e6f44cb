"""Fuzzy dedup throughput and clusters: the MinHash dedup step against datasketch's MinHash + MinHashLSH.

All runs are in this process on the same documents (stories from ``storygen`` plus planted near
duplicates), alternating ``--repeat`` times (medians reported), with the same shingles (word
5-grams of the normalised text), ``num_perm``, threshold and LSH bands/rows; each verifies
candidates by estimated Jaccard >= threshold and joins verified pairs into clusters.

* ours: :func:`marin.curation.dedup_steps.fuzzy_deduplicated` end to end through a ``StepRunner``:
  reading jsonl, signatures, band buckets through ``group_by``, sharded connected components, and
  writing every document with its attributes as jsonl.zst.
* datasketch: ``MinHash.bulk`` over the shingle strings with its defaults (SHA-1 shingle hashes,
  its own seeded coefficients), ``MinHashLSH.insert`` then ``query`` per document,
  ``MinHash.jaccard`` on each candidate, a union-find over verified pairs (texts already in memory,
  nothing written). This is the speed peer: ``ratio`` is its time over ours.
* datasketch, same functions: the same pipeline given our shingle hashes and our coefficients
  (both use the affine32 family), so its signatures equal ours bit for bit; ``same_clusters``
  compares our clusters with these. The clusters of plain datasketch are compared too: with other
  hash functions, pairs whose similarity is near the threshold fall on either side by chance, and
  ``pairs_differing_with_other_functions`` counts them.

Usage: ``python bench/dedup_throughput.py [--docs 10000] [--repeat 3] [--backend inline]``. The last
line printed is one JSON object; the targets are ``ratio >= 1.0`` and ``same_clusters``.
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
from marin.curation.dedup.minhash import WordShingleHasher, permutations, shingles
from marin.curation.dedup_steps import FuzzyDedupConfig, fuzzy_deduplicated
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from storygen import generate_stories


def corpus(count: int, seed: int = 0) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(id, text) of ``count`` documents, a tenth of them near duplicates (2% of words replaced); the planted pairs."""
    rng = random.Random(seed)
    originals = generate_stories(count - count // 10, seed=seed)
    docs = [(f"doc-{i:06d}", t) for i, t in enumerate(originals)]
    planted = []
    for n in range(count // 10):
        source = rng.randrange(len(originals))
        words = originals[source].split()
        for k in rng.sample(range(len(words)), max(1, len(words) // 50)):
            words[k] = "pebble"
        docs.append((f"near-{n:06d}", " ".join(words)))
        planted.append((f"doc-{source:06d}", f"near-{n:06d}"))
    return docs, planted


def true_jaccard(left: str, right: str, ngram: int) -> float:
    x, y = set(shingles(left, ngram)), set(shingles(right, ngram))
    return len(x & y) / len(x | y)


def run_ours(docs, config: FuzzyDedupConfig, backend: str, folder: Path) -> tuple[float, dict[str, str]]:
    data = folder / "input"
    data.mkdir(parents=True)
    for f in range(4):
        with open(data / f"part-{f}.jsonl", "w") as handle:
            handle.writelines(json.dumps({"id": doc_id, "text": text}) + "\n" for doc_id, text in docs[f::4])
    step = fuzzy_deduplicated("bench/fuzzy", str(data), config=config, mode="mark", backend=backend)
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


def run_datasketch(docs, config: FuzzyDedupConfig, bands: int, rows: int,
                   same_functions: bool) -> tuple[float, dict[str, str]]:
    start = time.perf_counter()
    if same_functions:  # our 64-bit shingle hashes, folded to 32 bits by datasketch's hashfunc
        hasher = WordShingleHasher(config.ngram, config.seed)
        values = [[int(v) for v in h] for i in range(0, len(docs), 512)
                  for h in hasher([text for _, text in docs[i:i + 512]])]
        hashes = MinHash.bulk(values, num_perm=config.num_perm, seed=config.seed, scheme="affine32",
                              permutations=permutations(config.minhash()), hashfunc=_fold32)
    else:
        values = [[s.encode("utf-8") for s in shingles(text, config.ngram, config.shingle)] for _, text in docs]
        hashes = MinHash.bulk(values, num_perm=config.num_perm, seed=config.seed)
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


def _fold32(value: int) -> int:
    """The fold of :func:`marin.curation.dedup.minhash.fold32`, for one Python int."""
    return (value >> 32) ^ (value & 0xFFFFFFFF)


def clustered_pairs(clusters: dict[str, str]) -> set[tuple[str, str]]:
    groups: dict[str, list[str]] = {}
    for doc, label in clusters.items():
        groups.setdefault(label, []).append(doc)
    return {(a, b) for g in groups.values() for i, a in enumerate(sorted(g)) for b in sorted(g)[i + 1:]}


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
    docs, planted = corpus(args.docs)
    times: dict[str, list[float]] = {"ours": [], "datasketch": [], "same_functions": []}
    for _ in range(args.repeat):  # alternating, so all see the same load on a shared machine
        elapsed, ds_clusters = run_datasketch(docs, config, bands, rows, same_functions=False)
        times["datasketch"].append(elapsed)
        elapsed, same_clusters = run_datasketch(docs, config, bands, rows, same_functions=True)
        times["same_functions"].append(elapsed)
        with tempfile.TemporaryDirectory() as folder:
            elapsed, our_clusters = run_ours(docs, config, args.backend, Path(folder))
        times["ours"].append(elapsed)
    median = {name: statistics.median(values) for name, values in times.items()}
    ours, same, other = clustered_pairs(our_clusters), clustered_pairs(same_clusters), clustered_pairs(ds_clusters)
    texts = dict(docs)
    strong = [(a, b) for a, b in planted if true_jaccard(texts[a], texts[b], config.ngram) >= 0.8]
    recall = sum(our_clusters[a] == our_clusters[b] for a, b in strong) / max(len(strong), 1)
    report = {
        "documents": len(docs), "num_perm": config.num_perm, "threshold": config.threshold,
        "bands": bands, "rows": rows, "backend": args.backend,
        "ours_docs_per_s": round(len(docs) / median["ours"], 1),
        "datasketch_docs_per_s": round(len(docs) / median["datasketch"], 1),
        "datasketch_same_functions_docs_per_s": round(len(docs) / median["same_functions"], 1),
        "ratio": round(median["datasketch"] / median["ours"], 2),
        "same_clusters": ours == same, "duplicate_pairs": len(ours),
        "pairs_only_ours": len(ours - same), "pairs_only_datasketch_same_functions": len(same - ours),
        "pairs_differing_with_other_functions": len(ours ^ other),
        "planted_pairs_jaccard_ge_0.8": len(strong), "recall_planted": round(recall, 4),
        "min_true_jaccard_of_clustered_pairs": round(min(
            (true_jaccard(texts[a], texts[b], config.ngram) for a, b in ours), default=1.0), 3),
    }
    print(f"ours {report['ours_docs_per_s']} docs/s, datasketch {report['datasketch_docs_per_s']} docs/s, "
          f"ratio {report['ratio']}x; same clusters as datasketch with the same functions: {report['same_clusters']}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
