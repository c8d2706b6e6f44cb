"""Evaluating language models on token caches: loss, perplexity and bits per byte per dataset.

See ``docs/evaluation.md``. ``LmEvaluator(model, seq_len=..., batch_size=...).evaluate(cache, tokenizer)``
scores every token of a cache once and returns a :class:`TextEvalResult`.
"""

from levanter.eval.byte_counts import TokenizerMismatchError, check_tokenizer_matches, document_byte_counts
from levanter.eval.scoring_windows import ScoringWindows
from levanter.eval.text_eval import (
    EvalSetupError,
    LmEvaluator,
    TextEvalResult,
    bits_per_byte,
    evaluate_cache,
    perplexity,
)

__all__ = [
    "EvalSetupError",
    "LmEvaluator",
    "ScoringWindows",
    "TextEvalResult",
    "TokenizerMismatchError",
    "bits_per_byte",
    "check_tokenizer_matches",
    "document_byte_counts",
    "evaluate_cache",
    "perplexity",
]
