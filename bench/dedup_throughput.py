"""Fuzzy dedup throughput and clusters: the MinHash dedup step against datasketch's MinHash + MinHashLSH,
and the step's signature kernel against upstream Marin's dupekit at equal work.

All runs of the step and datasketch are in this process on the same documents (stories from
``storygen`` plus planted near duplicates), alternating ``--repeat`` times (medians reported), with
the same shingles (word 5-grams of the normalised text), ``num_perm``, threshold and LSH
bands/rows; each verifies candidates by estimated Jaccard >= threshold and joins verified pairs
into clusters.

* ours: :func:`marin.curation.dedup_steps.fuzzy_deduplicated` end to end through a ``StepRunner``:
  reading jsonl, signatures, band buckets from sorted runs, sharded connected components, and
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

With ``--upstream-python PATH`` (an interpreter with ``marin-dupekit`` and ``pyarrow`` installed),
the kernels are compared as well, each side in a process of its own, alternating ``--repeat``
times on the same documents: the shared TinyStories sample repeated to ``--kernel-docs``, one in a
hundred a long document of 30 stories. The work is upstream's own benchmark's: character 5-grams,
286 permutations, 26 bands of 11 rows, batches of 512 documents, texts already in memory. Ours is
the step's key function (:class:`marin.curation.dedup.buckets.BandKeys`: normalisation, shingle
hashes, signatures, band keys); dupekit's is ``transform`` with ``CleanText``, ``MinHash`` and
``MinHashLSH``. ``kernel_ratio`` is dupekit's time over ours.

Usage: ``python bench/dedup_throughput.py [--docs 10000] [--repeat 3] [--backend inline]
[--upstream-python /tmp/dupekit-venv/bin/python [--kernel-docs 20000] [--no-step]]``. The last line
printed is one JSON object; the targets are ``ratio >= 1.0``, ``same_clusters`` and
``kernel_ratio >= 1.0``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zstandard
from datasketch import MinHash, MinHashLSH
from marin.curation.dedup.buckets import BandKeys
from marin.curation.dedup.minhash import MinHashConfig, WordShingleHasher, permutations, shingles
from marin.curation.dedup.records import Doc
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

# -- the signature kernel against dupekit -----------------------------------------------------------

# The shared sample: under MARIN_TEST_DATA when set (a worktree has no shared/ beside it), else beside the checkout.
SHARED = Path(os.environ.get("MARIN_TEST_DATA") or Path(__file__).resolve().parents[1].parent / "shared")
STORIES = SHARED / "data" / "tinystories" / "train.jsonl"
KERNEL_WORK = {"ngram": 5, "num_perm": 286, "bands": 26, "rows": 11, "batch": 512}

# Runs in the upstream interpreter: argv[1] is a JSON file of texts, argv[2] the work; prints one JSON object.
DUPEKIT_WORKER = """
import json, sys, time
from importlib.metadata import version
import dupekit, pyarrow as pa
from dupekit import Transformation
work = json.loads(sys.argv[2])
with open(sys.argv[1]) as handle:
    texts = json.load(handle)
steps = [Transformation.CleanText("text", "clean"),
         Transformation.MinHash("clean", "signature", num_perms=work["num_perm"], ngram_size=work["ngram"], seed=1),
         Transformation.MinHashLSH("signature", "buckets", num_bands=work["bands"])]
batches = [pa.RecordBatch.from_pydict({"text": texts[i:i + work["batch"]]}) for i in range(0, len(texts), work["batch"])]
start = time.perf_counter()
rows = sum(dupekit.transform(batch, steps).num_rows for batch in batches)
print(json.dumps({"seconds": time.perf_counter() - start, "documents": rows, "version": version("marin-dupekit")}))
"""


def kernel_corpus(count: int) -> list[str]:
    """The TinyStories sample repeated to ``count`` texts; every hundredth is 30 stories (about 25,000 characters)."""
    with open(STORIES) as handle:
        stories = [json.loads(line)["text"] for line in handle]
    texts, next_story = [], 0
    while len(texts) < count:
        take = 30 if len(texts) % 100 == 99 else 1
        texts.append("\n\n".join(stories[(next_story + k) % len(stories)] for k in range(take)))
        next_story += take
    return texts


def kernel_worker(path: str) -> None:
    """Our side of the kernel comparison, in its own process: the step's band-key function."""
    with open(path) as handle:
        texts = json.load(handle)
    work = KERNEL_WORK
    config = MinHashConfig(num_perm=work["num_perm"], ngram=work["ngram"], shingle="char", seed=1)
    keys = BandKeys(config, work["bands"], work["rows"]).open()
    batches = [[Doc(0, i + k, str(i + k), text, {}) for k, text in enumerate(texts[i:i + work["batch"]])]
               for i in range(0, len(texts), work["batch"])]
    start = time.perf_counter()
    documents = sum(len(keys(batch).signatures) for batch in batches)
    print(json.dumps({"seconds": time.perf_counter() - start, "documents": documents}))


def run_kernels(upstream_python: str, count: int, repeat: int) -> dict:
    """Ours and dupekit on the same texts, each in a fresh process, alternating; medians of ``repeat``."""
    texts = kernel_corpus(count)
    times: dict[str, list[float]] = {"ours": [], "dupekit": []}
    upstream_version = None
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "texts.json")
        with open(path, "w") as handle:
            json.dump(texts, handle)
        commands = {"ours": [sys.executable, __file__, "--kernel-worker", path],
                    "dupekit": [upstream_python, "-c", DUPEKIT_WORKER, path, json.dumps(KERNEL_WORK)]}
        for _ in range(repeat):
            for side, command in commands.items():
                done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=1800)
                found = json.loads(done.stdout.splitlines()[-1])
                assert found["documents"] == len(texts), found
                times[side].append(found["seconds"])
                upstream_version = found.get("version", upstream_version)
    median = {side: statistics.median(values) for side, values in times.items()}
    return {"documents": len(texts), "characters_per_document": round(sum(map(len, texts)) / len(texts)),
            **KERNEL_WORK, "dupekit_version": upstream_version,
            "ours_docs_per_s": round(len(texts) / median["ours"]),
            "dupekit_docs_per_s": round(len(texts) / median["dupekit"]),
            "kernel_ratio": round(median["dupekit"] / median["ours"], 2),
            "runs_seconds": {side: [round(t, 3) for t in values] for side, values in times.items()}}


def compare_step(args: argparse.Namespace) -> dict:
    """The step against datasketch, in this process, alternating; medians and the clusters' comparison."""
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
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=10000)
    parser.add_argument("--backend", default="inline")
    parser.add_argument("--threshold", type=float, default=0.7)
    parser.add_argument("--num-perm", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--upstream-python", help="an interpreter with marin-dupekit: compare the kernels too")
    parser.add_argument("--kernel-docs", type=int, default=20000)
    parser.add_argument("--no-step", action="store_true", help="only the kernel comparison")
    parser.add_argument("--kernel-worker", help=argparse.SUPPRESS)  # a JSON file of texts: our side, in its own process
    args = parser.parse_args()
    if args.kernel_worker:
        kernel_worker(args.kernel_worker)
        return
    report = {} if args.no_step else compare_step(args)
    if args.upstream_python:
        kernel = run_kernels(args.upstream_python, args.kernel_docs, args.repeat)
        print(f"kernel: ours {kernel['ours_docs_per_s']} docs/s, dupekit {kernel['dupekit_version']} "
              f"{kernel['dupekit_docs_per_s']} docs/s, ratio {kernel['kernel_ratio']}x")
        report["kernel_vs_dupekit"] = kernel
    print(json.dumps(report))


if __name__ == "__main__":
    main()
