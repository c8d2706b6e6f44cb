"""Language identification: each document's language and confidence, kept if in a set and confident.

The model is chosen by name (:mod:`marin.curation.language_models`): fastText's ``lid.176``
(``"fasttext-lid176"``, the default) or py3langid's (``"py3langid"``). Both ship inside their
wheels: nothing is downloaded when a step runs. Confidence is the model's probability of its best
language. The model's name and file checksum are part of the step's identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.curation.language_models import DEFAULT_LANGUAGE_MODEL, LanguageModelIdentity, language_model
from marin.curation.steps import StepOptions, Verdict, rule_step
from marin.execution.lazy import LazyStep

if TYPE_CHECKING:
    from typing_extensions import Unpack


def identify_language(text: str, model: str = DEFAULT_LANGUAGE_MODEL) -> tuple[str, float]:
    """``(ISO 639 code, confidence in [0, 1])`` for ``text``; ``("und", 0.0)`` when it has no letters."""
    if not any(ch.isalpha() for ch in text):
        return "und", 0.0
    language, probability = language_model(model).classify(text)
    return language, round(probability, 6)


@dataclass(frozen=True)
class LanguageFilter:
    """Keep documents whose language is in ``languages`` (all, when empty) with confidence >= ``threshold``."""

    languages: tuple[str, ...]
    threshold: float
    model: LanguageModelIdentity

    def __call__(self, record: dict[str, Any], text_field: str = "text") -> Verdict:
        language, confidence = identify_language(record[text_field], self.model.name)
        attributes = {"language": language, "language_score": confidence}
        if self.languages and language not in self.languages:
            return Verdict(False, f"language_not_wanted:{language}", confidence, attributes)
        if confidence < self.threshold:
            return Verdict(False, "language_low_confidence", confidence, attributes)
        return Verdict(True, None, confidence, attributes)


def language_filtered(
    name: str,
    source: Any,
    languages: tuple[str, ...] | list[str] = ("en",),
    threshold: float = 0.65,
    *,
    model: str = DEFAULT_LANGUAGE_MODEL,
    **options: Unpack[StepOptions],
) -> LazyStep:
    """A lazy step writing ``language``/``language_score`` per document and keeping the wanted ones.

    ``model``: ``"fasttext-lid176"`` or ``"py3langid"`` (see :mod:`marin.curation.language_models`).
    """
    rule = LanguageFilter(tuple(sorted(languages)), float(threshold), language_model(model).identity())
    return rule_step(name, "language", source, rule, **options)
