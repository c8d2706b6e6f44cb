"""Language identification: each document's language and confidence, kept if in a set and confident.

The model is py3langid's (the langid.py model: a naive Bayes classifier over byte n-grams, 97
languages), which ships inside its wheel: nothing is downloaded when a step runs. Confidence is
the model's normalised probability of its best language.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin.curation.damaged_input import OnDamagedInput
from marin.curation.steps import FieldRule, Mode, OutputFormat, Verdict, curation_step
from marin.execution.lazy import LazyStep

_identifier = None


def _model():
    """The langid identifier, loaded once per process (the model unpickles in about a second)."""
    global _identifier
    if _identifier is None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _identifier


def identify_language(text: str) -> tuple[str, float]:
    """``(ISO 639-1 code, confidence in [0, 1])`` for ``text``; ``("und", 0.0)`` when it has no letters."""
    if not any(ch.isalpha() for ch in text):
        return "und", 0.0
    language, probability = _model().classify(text)
    return str(language), round(float(probability), 6)


@dataclass(frozen=True)
class LanguageFilter:
    """Keep documents whose language is in ``languages`` (all, when empty) with confidence >= ``threshold``."""

    languages: tuple[str, ...] = ("en",)
    threshold: float = 0.65

    def __call__(self, record: dict[str, Any], text_field: str = "text") -> Verdict:
        language, confidence = identify_language(record[text_field])
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
    text_field: str = "text",
    mode: Mode = "remove",
    output_format: OutputFormat = "jsonl",
    version: str | None = None,
    backend: Any = None,
    on_damaged_input: OnDamagedInput = "fail",
) -> LazyStep:
    """A lazy step writing ``language``/``language_score`` per document and keeping the wanted ones."""
    rule = LanguageFilter(tuple(sorted(languages)), float(threshold))
    return curation_step(
        name, "language", source, rule, lambda ctx: FieldRule(rule, text_field),
        text_field=text_field, mode=mode, output_format=output_format, version=version, backend=backend,
        on_damaged_input=on_damaged_input,
    )
