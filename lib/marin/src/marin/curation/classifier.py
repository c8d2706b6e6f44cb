"""A trainable quality classifier: logistic regression on hashed word and character n-grams.

``quality_classifier(...)`` trains on two example sets (positive: text like what we want;
negative: text we do not) and saves the weights as ``model.npz`` in its output folder.
``classifier_filtered(...)`` scores every document with it (``score`` = probability of being
positive) and keeps those at or above ``threshold``, or the ``top_fraction`` best. Features are
word 1-2-grams and character 4-grams, hashed (a stable digest, the same in every process) into
``2**hash_bits`` buckets and L2-normalised; training is full-batch gradient descent with L2
regularisation in numpy, deterministic for a given input.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from rigging import filesystem as fsx

from marin.curation.steps import (
    CurationError,
    StepOptions,
    Verdict,
    curation_step,
    read_records,
    resolve_input,
)
from marin.execution.artifact import register_result_type
from marin.execution.lazy import LazyStep, lazy_step

if TYPE_CHECKING:
    from typing_extensions import Unpack

_WORD = re.compile(r"[^\W_]+")


@dataclass(frozen=True)
class ClassifierConfig:
    hash_bits: int = 18
    char_ngram: int = 4
    epochs: int = 200
    learning_rate: float = 2.0
    l2: float = 1e-4


def features(text: str, config: ClassifierConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(bucket indices, values)`` of ``text``'s hashed n-grams, L2-normalised."""
    words = _WORD.findall(text.casefold())
    grams = [f"w:{w}" for w in words] + [f"b:{a} {b}" for a, b in itertools.pairwise(words)]
    squashed = " ".join(words)
    grams += [f"c:{squashed[i:i + config.char_ngram]}" for i in range(len(squashed) - config.char_ngram + 1)]
    if not grams:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    mask = (1 << config.hash_bits) - 1
    buckets, counts = np.unique(np.fromiter((zlib.crc32(g.encode("utf-8")) & mask for g in grams), np.int64, len(grams)),
                                return_counts=True)
    values = counts.astype(np.float64)
    return buckets, values / np.linalg.norm(values)


def _design(texts: list[str], config: ClassifierConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows as a flat (row ids, buckets, values) triple: a sparse matrix without scipy."""
    rows, cols, vals = [], [], []
    for i, text in enumerate(texts):
        c, v = features(text, config)
        rows.append(np.full(len(c), i))
        cols.append(c)
        vals.append(v)
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


def train_logistic(positive: list[str], negative: list[str], config: ClassifierConfig) -> tuple[np.ndarray, float]:
    """Weights and bias minimising the mean log-loss (classes weighted equally) plus L2."""
    if not positive or not negative:
        raise CurationError(f"training needs both positive and negative examples (got {len(positive)} and {len(negative)})")
    texts = positive + negative
    labels = np.array([1.0] * len(positive) + [0.0] * len(negative))
    sample_weight = np.where(labels == 1, 0.5 / len(positive), 0.5 / len(negative))
    rows, cols, vals = _design(texts, config)
    weights, bias = np.zeros(1 << config.hash_bits), 0.0
    for _ in range(config.epochs):
        logits = np.bincount(rows, weights=weights[cols] * vals, minlength=len(texts)) + bias
        error = (1.0 / (1.0 + np.exp(-logits)) - labels) * sample_weight
        gradient = np.bincount(cols, weights=error[rows] * vals, minlength=len(weights)) + config.l2 * weights
        weights -= config.learning_rate * gradient
        bias -= config.learning_rate * float(error.sum())
    return weights, bias


@dataclass(frozen=True)
class LinearScorer:
    """Picklable: a document's probability of being a positive example."""

    weights: np.ndarray
    bias: float
    config: ClassifierConfig

    def score(self, text: str) -> float:
        buckets, values = features(text, self.config)
        logit = float(self.weights[buckets] @ values) + self.bias
        return 1.0 / (1.0 + math.exp(-max(min(logit, 60.0), -60.0)))


def auc(positive_scores: list[float], negative_scores: list[float]) -> float:
    """Area under the ROC curve: the chance a random positive outscores a random negative (ties half)."""
    wins = sum((p > n) + 0.5 * (p == n) for p in positive_scores for n in negative_scores)
    return wins / (len(positive_scores) * len(negative_scores))


@register_result_type
@dataclass(frozen=True)
class QualityClassifier:
    """The training step's result: where the weights are, and how well it fits its training set."""

    model_path: str
    config: ClassifierConfig
    positives: int
    negatives: int
    train_auc: float


def load_scorer(result: QualityClassifier) -> LinearScorer:
    with fsx.open_url(result.model_path, "rb") as handle:
        data = np.load(handle)
        return LinearScorer(np.array(data["weights"]), float(data["bias"]), result.config)


def quality_classifier(
    name: str,
    positive: Any,
    negative: Any,
    *,
    config: ClassifierConfig = ClassifierConfig(),
    text_field: str = "text",
    version: str | None = None,
) -> LazyStep:
    """A lazy step training the classifier on ``positive`` vs ``negative`` documents (files or steps)."""
    pos, neg = resolve_input(positive), resolve_input(negative)

    def run(ctx) -> QualityClassifier:
        texts = {label: [r[text_field] for r in read_records(source.files_at_run_time(ctx), text_field) if r.get("kept", True)]
                 for label, source in (("positive", pos), ("negative", neg))}
        weights, bias = train_logistic(texts["positive"], texts["negative"], config)
        scorer = LinearScorer(weights, bias, config)
        train_auc = auc([scorer.score(t) for t in texts["positive"]], [scorer.score(t) for t in texts["negative"]])
        model_path = fsx.join(ctx.output_path, "model.npz")
        with fsx.atomic_open(model_path, "wb") as handle:
            np.savez(handle, weights=weights.astype(np.float32), bias=np.float64(bias))
        return QualityClassifier(model_path, config, len(texts["positive"]), len(texts["negative"]), round(train_auc, 6))

    return lazy_step(
        name, run, deps=pos.deps + neg.deps,
        hash_attrs={"curation": "train_quality_classifier", "config": config, "positive": pos.identity,
                    "negative": neg.identity, "text_field": text_field},
        version=version,
    )


@dataclass(frozen=True)
class _Threshold:
    scorer: LinearScorer
    threshold: float
    text_field: str

    def __call__(self, record: dict) -> Verdict:
        score = round(self.scorer.score(record[self.text_field]), 6)
        if score >= self.threshold:
            return Verdict(True, None, score)
        return Verdict(False, "classifier_below_threshold", score)


def classifier_filtered(
    name: str,
    source: Any,
    classifier: LazyStep,
    *,
    threshold: float | None = 0.5,
    top_fraction: float | None = None,
    **options: Unpack[StepOptions],
) -> LazyStep:
    """A lazy step writing ``score`` per document and keeping those >= ``threshold``.

    With ``top_fraction`` the threshold is the score of the ``top_fraction`` best document (a first
    pass scores everything in this process), so about that fraction is kept.
    """
    if top_fraction is not None and not 0 < top_fraction <= 1:
        raise CurationError(f"top_fraction must be in (0, 1], got {top_fraction}")
    resolved = resolve_input(source)
    text_field = options.get("text_field", "text")

    def make_annotator(ctx) -> _Threshold:
        scorer = load_scorer(ctx.load_artifact(classifier, QualityClassifier).result)
        cut = threshold if threshold is not None else 0.0
        if top_fraction is not None:
            scores = sorted((round(scorer.score(r[text_field]), 6) for r in read_records(resolved.files_at_run_time(ctx), text_field)
                             if r.get("kept", True)), reverse=True)
            cut = scores[max(0, math.ceil(top_fraction * len(scores)) - 1)] if scores else 1.0
        return _Threshold(scorer, cut, text_field)

    rule = {"threshold": None if top_fraction is not None else threshold, "top_fraction": top_fraction}
    return curation_step(
        name, "quality_classifier", source, rule, make_annotator, extra_deps=(classifier,), **options
    )
