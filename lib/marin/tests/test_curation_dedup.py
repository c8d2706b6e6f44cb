"""Dedup steps against known answers on generated stories with planted exact and near duplicates."""

import itertools
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import zstandard
from marin.curation.dedup import minhash
from marin.curation.dedup.minhash import (
    SIGNATURE_SCHEMES,
    MinHashConfig,
    WordShingleHasher,
    batch_shingle_hashes,
    candidate_probability,
    char_shingle_hashes,
    fmix32,
    fold32,
    lsh_params,
    normalize_text,
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


def reference_char_hash(ngram: str) -> int:
    """The character shingle hash in plain Python: multiply-xor over code points, then splitmix64's finaliser."""
    mask = (1 << 64) - 1
    key = 0x9E3779B97F4A7C15
    for ch in ngram:
        key = ((key ^ ord(ch)) * 0x100000001B3) & mask
    key = ((key ^ (key >> 30)) * 0xBF58476D1CE4E5B9) & mask
    key = ((key ^ (key >> 27)) * 0x94D049BB133111EB) & mask
    return key ^ (key >> 31)


def test_char_shingle_hashes_hash_every_window_of_the_normalised_text():
    texts = generate_stories(6, seed=4) + ["", "ab", "abcde", "  Tiny\tTEXT  here\n", "caf\u00e9 \ud800 lone surrogate"]
    hashes = char_shingle_hashes(texts, NGRAM)
    for text, found in zip(texts, hashes):
        chars = normalize_text(text)
        windows = [chars[i:i + NGRAM] for i in range(len(chars) - NGRAM + 1)] if len(chars) > NGRAM else [chars]
        assert found.tolist() == [reference_char_hash(w) for w in windows]
        assert len(set(found.tolist())) == len(set(windows))  # the shingle sets of the strings, no collision
    # A text's hashes do not depend on the texts batched with it.
    assert all((char_shingle_hashes([t], NGRAM)[0] == h).all() for t, h in zip(texts, hashes))


def test_signatures_do_not_depend_on_how_the_shingles_are_cut_into_blocks(monkeypatch):
    config = MinHashConfig(num_perm=40, ngram=NGRAM, shingle="char")
    a, b = permutations(config)
    texts = generate_stories(5, seed=8) + [" ".join(generate_stories(12, seed=9)), "x"]  # one spans many blocks
    hashes = batch_shingle_hashes(texts, config)
    whole = signatures(hashes, a, b)
    for h, signature in zip(hashes, whole):  # the definition, one document at a time in 64-bit arithmetic
        values = fmix32(fold32(h)).astype(np.uint64)
        expected = (values[:, None] * a.astype(np.uint64) + b) % (1 << 32)
        assert expected.min(axis=0).tolist() == signature.tolist()
    monkeypatch.setattr(minhash, "_SHINGLES_PER_BLOCK", 97)
    assert (signatures(hashes, a, b) == whole).all()


def test_the_step_identity_names_the_signature_kernel(corpus):
    folder, *_ = corpus
    word = fuzzy_deduplicated("dedup/fuzzy", str(folder))
    char = fuzzy_deduplicated("dedup/fuzzy", str(folder), config=FuzzyDedupConfig(shingle="char"))
    # The word kernel's name is unchanged, so outputs it made earlier are still reused.
    assert word.identity_record["hash_attrs"]["fuzzy"]["signature"] == "xxh3-fold32-fmix32-affine32"
    char_kernel = char.identity_record["hash_attrs"]["fuzzy"]["signature"]
    assert char_kernel == SIGNATURE_SCHEMES["char"] != SIGNATURE_SCHEMES["word"]
    assert word.identity != char.identity


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


@pytest.mark.parametrize("shingle", ["word", "char"])
def test_minhash_recall_and_precision_on_planted_pairs(corpus, tmp_path, shingle):
    folder, texts, exact, near = corpus
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    config = FuzzyDedupConfig(threshold=0.7, ngram=NGRAM, shingle=shingle)
    step = fuzzy_deduplicated("dedup/fuzzy", str(folder), config=config, backend="inline", num_shards=3)
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
