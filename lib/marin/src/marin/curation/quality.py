"""Quality heuristics: the C4 clean-up, then the Gopher rules, each rule named when it removes.

C4 (Raffel et al. 2020, :mod:`marin.curation.quality_c4`) works line by line, as its reference
does: lines that fail its line rules are dropped from the text, and a page is removed for "lorem
ipsum" or a ``{`` on a line still standing, or for too few sentences left. Gopher (Rae et al.
2021, :mod:`marin.curation.quality_gopher`) bounds word count and mean word length, symbols,
bullet and ellipsis lines, words with a letter, stop words and repetition. Every rule is a field
of a frozen config, so a variant is a ``replace(GOPHER, max_symbol_word_ratio=0.2)`` away, and a
removed document's ``reason`` names the first rule it failed (``failed_rules`` lists them all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.curation.quality_c4 import C4, C4Rules
from marin.curation.quality_gopher import GOPHER, GopherRules
from marin.curation.steps import StepOptions, Verdict, rule_step
from marin.execution.lazy import LazyStep

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["C4", "GOPHER", "C4Rules", "GopherRules", "QualityRules", "quality_filtered"]


@dataclass(frozen=True)
class QualityRules:
    """Which rule sets run: C4 first (it rewrites the text, when ``rewrite``), then Gopher on the result."""

    gopher: GopherRules | None = GOPHER
    c4: C4Rules | None = C4
    rewrite: bool = True  # write the C4-cleaned text in place of the original

    def __call__(self, record: dict[str, Any], text_field: str = "text") -> Verdict:
        text = record[text_field]
        failed: list[str] = []
        attributes: dict[str, Any] = {}
        if self.c4 is not None:
            cleaned, page_failures = self.c4.clean(text)
            failed.extend(page_failures)
            attributes["c4_lines_dropped"] = _count_lines(text) - _count_lines(cleaned)
            if self.rewrite:
                attributes[text_field] = cleaned
                text = cleaned
        if self.gopher is not None:
            failed.extend(self.gopher.failures(text))
        attributes["failed_rules"] = failed
        return Verdict(not failed, failed[0] if failed else None, None, attributes)


def _count_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def quality_filtered(
    name: str,
    source: Any,
    *,
    gopher: GopherRules | None = GOPHER,
    c4: C4Rules | None = C4,
    rewrite: bool = True,
    **options: Unpack[StepOptions],
) -> LazyStep:
    """A lazy step applying the C4 and Gopher rules (either may be ``None``); reasons name the rule.

    The step's identity covers both rule sets' settings and their ``definition`` (what the rules
    measure), so a change to either reruns the step instead of reusing an older output.
    """
    rules = QualityRules(gopher, c4, rewrite)
    return rule_step(name, "quality_heuristics", source, rules, **options)
