"""Dedup steps against known answers on generated stories with planted exact and near duplicates."""

import itertools
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import zstandard
from marin.curation.dedup.minhash import (
    MinHashConfig,
    WordShingleHasher,
    batch_shingle_hashes,
    candidate_probability,
    fold32,
    lsh_params,
    permutations,
    signatures,
)
from marin.curation.dedup_steps import (
    FuzzyDedupConfig,
    exact_deduplicated,
    fuzzy_deduplicated,
)
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from storygen import generate_stories

NGRAM = 5


def word_ngrams(text: str) -> set[str]:
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i:i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def true_jaccard(a: str, b: str) -> float:
    x, y = word_ngrams(a), word_ngrams(b)
    return len(x & y) / len(x | y)


def edit_words(text: str, fraction: float, rng: random.Random) -> str:
    words = text.split()
    for k in rng.sample(range(len(words)), max(1, round(len(words) * fraction))):
        words[k] = rng.choice(["pebble", "lantern", "quietly", "meadow", "seven", "button"])
    return " ".join(words)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(folder, texts by id, planted exact pairs, planted near pairs) over three jsonl files."""
    rng = random.Random(7)
    texts = {f"doc-{i:04d}": t for i, t in enumerate(generate_stories(240, seed=11))}
    originals = list(texts)
    exact, near = [], []
    for n, original in enumerate(rng.sample(originals, 20)):
        copy = f"dup-{n:04d}"
        texts[copy] = "  " + texts[original].upper() + " "  # equal after normalisation
        exact.append((original, copy))
    for n, original in enumerate(rng.sample(originals, 40)):
        copy = f"near-{n:04d}"
        texts[copy] = edit_words(texts[original], rng.uniform(0.005, 0.06), rng)
        near.append((original, copy))
    folder = tmp_path_factory.mktemp("corpus") / "docs"
    folder.mkdir()
    ids = sorted(texts, key=lambda _: rng.random())
    for f in range(3):
        with open(folder / f"shard-{f}.jsonl", "w") as handle:
            handle.writelines(json.dumps({"id": doc_id, "text": texts[doc_id]}) + "\n" for doc_id in ids[f::3])
    return folder, texts, exact, near


def read_records(files) -> list[dict]:
    out = []
    for path in files:
        with open(path, "rb") as handle:
            data = zstandard.ZstdDecompressor().stream_reader(handle).read().decode()
        out.extend(json.loads(line) for line in data.splitlines() if line)
    return out


def tree_bytes(folder: str) -> dict[str, bytes]:
    """The step's output files (data/, removed/, stats/), without the runner's own records (dot files, and the attempts' logs in .attempts/)."""
    root = Path(folder)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def every_document(result: dict) -> dict[str, dict]:
    """The documents passed on and removed, by id."""
    return {r["id"]: r for r in read_records(result["files"] + result["removed_files"])}


def removed_counts(result: dict) -> dict[str, int]:
    return {reason: bucket["documents"] for reason, bucket in result["summary"]["removed"].items()}


def test_signature_agreement_estimates_jaccard():
    config = MinHashConfig(num_perm=256, ngram=NGRAM)
    a, b = permutations(config)
    rng = random.Random(0)
    base = generate_stories(1, seed=5)[0]
    texts = [base, edit_words(base, 0.03, rng), edit_words(base, 0.15, rng)]
    sigs = signatures(batch_shingle_hashes(texts, config), a, b)
    for i, j in [(0, 1), (0, 2)]:
        assert abs((sigs[i] == sigs[j]).mean() - true_jaccard(texts[i], texts[j])) < 0.1
    # Batching does not change a document's signature.
    assert (signatures(batch_shingle_hashes(texts[1:2], config), a, b)[0] == sigs[1]).all()


def test_signatures_equal_datasketch_given_the_same_shingle_hashes_and_coefficients():
    """Our vectorised batch against datasketch's own MinHash (its affine32 family), one document at a time."""
    from datasketch import MinHash

    config = MinHashConfig(num_perm=64, ngram=NGRAM, seed=3)
    a, b = permutations(config)
    assert (a % 2 == 1).all()  # odd multipliers: each function is a bijection of 32-bit values
    texts = generate_stories(12, seed=2) + ["one two", "x"]  # short texts are a single shingle
    hashes = WordShingleHasher(NGRAM, config.seed)(texts)
    ours = signatures(hashes, a, b)
    for doc_hashes, signature in zip(hashes, ours):
        reference = MinHash(num_perm=config.num_perm, scheme="affine32", permutations=(a, b),
                            hashfunc=lambda value: int(fold32(np.uint64(value))))
        reference.update_batch([int(v) for v in doc_hashes])
        assert reference.hashvalues.tolist() == signature.tolist()


def test_lsh_params_put_the_s_curve_around_the_threshold():
    bands, rows = lsh_params(0.7, 128)
    assert bands * rows <= 128
    assert candidate_probability(0.4, bands, rows) < 0.1
    assert candidate_probability(0.9, bands, rows) > 0.9


def test_exact_dedup_finds_every_planted_copy(corpus, tmp_path):
    folder, texts, exact, _ = corpus
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    step = exact_deduplicated("dedup/exact", str(folder), backend="inline")
    runner.run([step])
    result = load_artifact(runner.output_path_for(step)).result
    records = every_document(result)
    assert len(records) == len(texts)
    removed = {r["id"] for r in read_records(result["removed_files"])}
    assert removed == {i for i, r in records.items() if not r["kept"]} == {copy for _, copy in exact}
    for original, copy in exact:
        assert records[copy]["reason"] == "exact-duplicate" and records[copy]["cluster"] == original
        assert records[original]["kept"] and records[original]["cluster"] == original
    assert removed_counts(result) == {"exact-duplicate": len(exact)}
    assert result["summary"]["documents_out"] == len(texts) - len(exact)


def test_minhash_recall_and_precision_on_planted_pairs(corpus, tmp_path):
    folder, texts, exact, near = corpus
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    step = fuzzy_deduplicated("dedup/fuzzy", str(folder), config=FuzzyDedupConfig(threshold=0.7, ngram=NGRAM),
                              backend="inline", num_shards=3)
    runner.run([step])
    result = load_artifact(runner.output_path_for(step)).result
    records = every_document(result)
    cluster = {i: r["cluster"] for i, r in records.items()}
    planted = [(a, b) for a, b in near + exact if true_jaccard(texts[a], texts[b]) >= 0.8]
    assert len(planted) >= 30
    recall = sum(cluster[a] == cluster[b] for a, b in planted) / len(planted)
    assert recall >= 0.95, recall
    members: dict[str, list[str]] = {}
    for doc_id, label in cluster.items():
        members.setdefault(label, []).append(doc_id)
    merged = [(a, b) for group in members.values() for a, b in itertools.combinations(group, 2)]
    assert min(true_jaccard(texts[a], texts[b]) for a, b in merged) >= 0.5
    for doc_id, record in records.items():
        if not record["kept"]:  # every removal names its cluster's kept document and the evidence
            assert record["reason"] == "near-duplicate" and records[record["cluster"]]["kept"]
            assert record["similarity"] >= 0.7 and cluster[record["similar_to"]] == record["cluster"]
    assert result["summary"]["documents_in"] == len(texts)
    assert result["summary"]["documents_out"] == len(members)


def test_outputs_are_identical_across_backends_and_reruns_are_cached(corpus, tmp_path):
    folder, *_ = corpus
    outputs = []
    for backend in ("inline", "processes"):
        runner = StepRunner(prefix=str(tmp_path / backend))
        exact = exact_deduplicated("dedup/exact", str(folder), backend=backend, num_shards=2)
        fuzzy = fuzzy_deduplicated("dedup/fuzzy", exact, backend=backend, num_shards=2)
        assert runner.run([fuzzy]).ran == ["dedup/exact", "dedup/fuzzy"]
        outputs.append((tree_bytes(runner.output_path_for(fuzzy)), tree_bytes(runner.output_path_for(exact))))
    assert outputs[0] == outputs[1]
    # Rerunning is fully cached; a new threshold reruns only the fuzzy step, with the same bytes for the rest.
    assert runner.run([fuzzy]).ran == []
    looser = fuzzy_deduplicated("dedup/fuzzy", exact, config=FuzzyDedupConfig(threshold=0.6), backend="inline")
    report = runner.run([looser])
    assert report.ran == ["dedup/fuzzy"] and report.cached == ["dedup/exact"]


def test_parquet_output_and_mark_mode(corpus, tmp_path):
    from marin.curation.steps import read_curated

    folder, texts, exact, _ = corpus
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    removing = exact_deduplicated("dedup/exact", str(folder), output_format="parquet", backend="inline")
    marking = exact_deduplicated("dedup/exact-marked", str(folder), mode="mark", backend="inline")
    runner.run([removing, marking])
    removed = load_artifact(runner.output_path_for(removing)).result
    assert all(path.endswith(".parquet") for path in removed["files"] + removed["removed_files"])
    assert {r["id"] for r in read_curated(removed["removed_files"])} == {copy for _, copy in exact}
    assert len(read_curated(removed["files"])) == len(texts) - len(exact)
    marked = load_artifact(runner.output_path_for(marking)).result
    assert marked["removed_files"] == [] and marked["summary"]["marked"]["exact-duplicate"]["documents"] == len(exact)
    records = read_curated(marked["files"])
    assert len(records) == len(texts) and sum(not r["kept"] for r in records) == len(exact)
