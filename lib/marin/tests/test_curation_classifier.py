"""The quality classifier: trained on clean stories vs generated spam, it separates a held-out set."""

from __future__ import annotations

import json
import random
from pathlib import Path

from marin.curation.classifier import (
    ClassifierConfig,
    LinearScorer,
    QualityClassifier,
    auc,
    classifier_filtered,
    load_scorer,
    quality_classifier,
)
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from storygen import generate_stories

_SPAM_WORDS = ("buy", "cheap", "now", "click", "here", "free", "offer", "limited", "casino", "bonus", "win", "deal",
               "viagra", "loan", "discount", "best", "price", "subscribe", "!!!", "$$$", "www", "com", "sale", "hot")


def spam(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = [rng.choice(_SPAM_WORDS) for _ in range(rng.randint(40, 120))]
        # Some story words mixed in, so the classifier cannot just count unknown words.
        words += rng.sample(["the", "girl", "went", "to", "the", "park", "and", "saw", "a", "big", "dog", "with", "her", "mom"], 6)
        rng.shuffle(words)
        texts.append(" ".join(words))
    return texts


def write_jsonl(path: Path, texts) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


def test_classifier_separates_held_out_stories_from_spam(tmp_path):
    stories = generate_stories(260, seed=21)
    negatives = spam(260, seed=4)
    train = quality_classifier("classifiers/stories", write_jsonl(tmp_path / "pos.jsonl", stories[:200]),
                               write_jsonl(tmp_path / "neg.jsonl", negatives[:200]), config=ClassifierConfig(hash_bits=16))
    held_out = [{"text": t, "label": 1} for t in stories[200:]] + [{"text": t, "label": 0} for t in negatives[200:]]
    source = tmp_path / "held.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in held_out))
    filtered = classifier_filtered("curated/classified", str(source), train, threshold=0.5, backend="inline")
    runner = StepRunner(prefix=str(tmp_path / "p"))
    runner.run([filtered])
    model = load_artifact(runner.output_path_for(train), QualityClassifier).result
    assert (model.positives, model.negatives) == (200, 200) and model.train_auc == 1.0
    result = load_artifact(runner.output_path_for(filtered), CuratedDataset).result
    scored = read_curated(result.files) + read_curated(result.removed_files)
    held_auc = auc([r["score"] for r in scored if r["label"] == 1], [r["score"] for r in scored if r["label"] == 0])
    assert held_auc > 0.99, held_auc  # measured: 1.0
    assert all(r["label"] == 1 for r in read_curated(result.files))
    assert result.summary["documents_out"] == 60
    assert {r["reason"] for r in read_curated(result.removed_files)} == {"classifier_below_threshold"}

    top = classifier_filtered("curated/top", str(source), train, top_fraction=0.25, backend="inline")
    runner.run([top])
    assert load_artifact(runner.output_path_for(top), CuratedDataset).result.summary["documents_out"] == 30
    assert isinstance(load_scorer(model), LinearScorer)
