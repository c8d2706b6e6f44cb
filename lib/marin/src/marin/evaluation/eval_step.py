"""The body of an eval step: one model, several tokenized datasets, a score per dataset."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from levanter.eval import LmEvaluator
from levanter.tokenization import load_tokenizer
from marin.errors import MarinError
from marin.evaluation.model_source import LoadedModel
from marin.evaluation.results import DatasetScore, EvalResults
from marin.processing.tokenize import TokenizedDataset

logger = logging.getLogger(__name__)


class EvalConfigError(MarinError, ValueError):
    """An evaluation that cannot give a meaningful answer as declared (wrong split, other tokenizer)."""


def run_evaluation(
    loaded: LoadedModel,
    datasets: Mapping[str, TokenizedDataset],
    *,
    model_label: str,
    model_identity: str,
    split: str,
    seq_len: int,
    batch_size: int,
    compute_dtype: str,
    model_tokenizer_identity: str | None = None,
    between_datasets: Callable[[], None] | None = None,
) -> EvalResults:
    """Score ``loaded`` on the ``split`` of every dataset; ``between_datasets`` runs before each one
    (the step passes its lease check, so a step taken over by another runner stops promptly)."""
    for name, data in datasets.items():
        if split not in data.splits:
            raise EvalConfigError(
                f"dataset {name!r} has no {split!r} split (it has: {', '.join(data.splits)}); tokenize it with "
                f"validation=... or evaluate another split with split=..."
            )
        if model_tokenizer_identity is not None and data.tokenizer_identity != model_tokenizer_identity:
            raise EvalConfigError(
                f"dataset {name!r} was tokenized with {data.tokenizer_identity[:19]}..., but the model was trained "
                f"with {model_tokenizer_identity[:19]}...; tokenize the evaluation data with the model's tokenizer."
            )
    started = time.perf_counter()
    evaluator = LmEvaluator(loaded.model, seq_len=seq_len, batch_size=batch_size, compute_dtype=compute_dtype)
    scores: dict[str, DatasetScore] = {}
    for i, (name, data) in enumerate(datasets.items(), 1):
        if between_datasets is not None:
            between_datasets()
        logger.info("evaluating %s on %s (%s split), dataset %d/%d", model_label, name, split, i, len(datasets))
        cache_path = data.cache_path(split)
        tokenizer = load_tokenizer(data.tokenizer_source)
        result = evaluator.evaluate(cache_path, tokenizer, name=name)
        scores[name] = DatasetScore(
            loss=result.loss,
            perplexity=result.perplexity,
            bits_per_byte=result.bits_per_byte,
            tokens=result.tokens,
            bytes=result.bytes,
            documents=result.documents,
            split=split,
            cache_path=cache_path,
        )
    return EvalResults(
        model=model_label,
        model_identity=model_identity,
        model_path=loaded.path,
        model_type=loaded.model_type,
        vocab_size=evaluator.vocab_size,
        seq_len=seq_len,
        batch_size=batch_size,
        compute_dtype=compute_dtype,
        eval_seconds=time.perf_counter() - started,
        datasets=scores,
    )
