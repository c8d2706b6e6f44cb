"""Quality heuristics: the Gopher document rules and the C4 line rules, each named when it removes.

Gopher (Rae et al. 2021, appendix A): bounds on word count and mean word length, symbol-to-word
ratio, bullet and ellipsis lines, words with a letter, stop words, and repetition (duplicate
lines and paragraphs, the most frequent n-gram, duplicated n-grams). C4 (Raffel et al. 2020):
lines that do not end in terminal punctuation, have too few words, mention javascript or a
cookie/terms policy are dropped from the text; pages with "lorem ipsum" or a curly brace, or too
few sentences left, are removed. Every rule is a field of a frozen config, so a variant is a
``replace(GOPHER, max_symbol_word_ratio=0.2)`` away, and a removed document's ``reason`` names the
first rule it failed (``failed_rules`` lists them all).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.curation.steps import StepOptions, Verdict, rule_step
from marin.execution.lazy import LazyStep

if TYPE_CHECKING:
    from typing_extensions import Unpack

_WORD = re.compile(r"\S+")
_ALPHA = re.compile(r"[^\W\d_]")
_BULLETS = ("•", "●", "○", "■", "□", "▪", "▫", "–", "-", "*", "·", "‣", "⁃", "◦")
_TERMINAL = (".", "!", "?", '"', "”", "’", "'")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)]*(?:\s|$)")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


@dataclass(frozen=True)
class GopherRules:
    """The Gopher quality filter's thresholds (the paper's values by default)."""

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines: float = 0.9
    max_ellipsis_lines: float = 0.3
    min_alpha_words: float = 0.8
    stop_words: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")
    min_stop_words: int = 2
    max_duplicate_lines: float = 0.3
    max_duplicate_paragraphs: float = 0.3
    max_duplicate_line_chars: float = 0.2
    max_duplicate_paragraph_chars: float = 0.2
    # n -> the most frequent n-gram's share of characters
    max_top_ngram_chars: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    # n -> the share of characters in n-grams that occur more than once
    max_duplicate_ngram_chars: tuple[tuple[int, float], ...] = (
        (5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10),
    )

    def failures(self, text: str) -> list[str]:
        """Names of the rules ``text`` fails, in the order above."""
        words = _WORD.findall(text)
        failed = []
        if not self.min_words <= len(words) <= self.max_words:
            failed.append("gopher_word_count")
        if not words:
            return failed
        mean_length = sum(len(w) for w in words) / len(words)
        if not self.min_mean_word_length <= mean_length <= self.max_mean_word_length:
            failed.append("gopher_mean_word_length")
        symbols = text.count("#") + text.count("...") + text.count("…")
        if symbols / len(words) > self.max_symbol_word_ratio:
            failed.append("gopher_symbol_word_ratio")
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        if lines and sum(line.startswith(_BULLETS) for line in lines) / len(lines) > self.max_bullet_lines:
            failed.append("gopher_bullet_lines")
        if lines and sum(line.endswith(("...", "…")) for line in lines) / len(lines) > self.max_ellipsis_lines:
            failed.append("gopher_ellipsis_lines")
        if sum(bool(_ALPHA.search(w)) for w in words) / len(words) < self.min_alpha_words:
            failed.append("gopher_alpha_words")
        lowered = {w.lower().strip(".,;:!?\"'()") for w in words}
        if sum(s in lowered for s in self.stop_words) < self.min_stop_words:
            failed.append("gopher_stop_words")
        failed.extend(self._repetition(text, lines, words))
        return failed

    def _repetition(self, text: str, lines: list[str], words: list[str]) -> list[str]:
        failed = []
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
        for unit, items, max_count, max_chars in (
            ("line", lines, self.max_duplicate_lines, self.max_duplicate_line_chars),
            ("paragraph", paragraphs, self.max_duplicate_paragraphs, self.max_duplicate_paragraph_chars),
        ):
            duplicate_count, duplicate_chars = _duplicates(items)
            total_chars = sum(len(item) for item in items) or 1
            if items and duplicate_count / len(items) > max_count:
                failed.append(f"gopher_duplicate_{unit}s")
            if duplicate_chars / total_chars > max_chars:
                failed.append(f"gopher_duplicate_{unit}_chars")
        lowered = [w.lower() for w in words]
        word_chars = sum(len(w) for w in lowered) or 1
        for n, limit in self.max_top_ngram_chars:
            grams = Counter(tuple(lowered[i : i + n]) for i in range(len(lowered) - n + 1))
            if grams:
                gram, count = grams.most_common(1)[0]
                if count > 1 and sum(len(w) for w in gram) * count / word_chars > limit:
                    failed.append(f"gopher_top_{n}gram_chars")
        for n, limit in self.max_duplicate_ngram_chars:
            if _duplicate_ngram_chars(lowered, n) / word_chars > limit:
                failed.append(f"gopher_duplicate_{n}gram_chars")
        return failed


def _duplicates(items: list[str]) -> tuple[int, int]:
    """How many items repeat an earlier one, and their characters."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        seen.add(item)
    return count, chars


def _duplicate_ngram_chars(words: list[str], n: int) -> int:
    """Characters of words covered by an n-gram that occurs more than once (each word counted once)."""
    grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    covered = [False] * len(words)
    for i in range(len(words) - n + 1):
        if grams[tuple(words[i : i + n])] > 1:
            for j in range(i, i + n):
                covered[j] = True
    return sum(len(w) for w, c in zip(words, covered) if c)


@dataclass(frozen=True)
class C4Rules:
    """The C4 filter: line rules that clean the text, then page rules on what is left."""

    min_words_per_line: int = 5
    min_sentences: int = 3
    drop_lines_without_terminal_punctuation: bool = True
    drop_javascript_lines: bool = True
    drop_policy_lines: bool = True
    remove_lorem_ipsum: bool = True
    remove_curly_braces: bool = True

    def clean(self, text: str) -> tuple[str, list[str]]:
        """``(text with bad lines dropped, names of the page rules it fails)``."""
        failed = []
        lowered = text.lower()
        if self.remove_lorem_ipsum and "lorem ipsum" in lowered:
            failed.append("c4_lorem_ipsum")
        if self.remove_curly_braces and ("{" in text or "}" in text):
            failed.append("c4_curly_brace")
        kept = [line.strip() for line in text.split("\n") if self._keep_line(line.strip())]
        cleaned = "\n".join(kept)
        if len(_SENTENCE_END.findall(cleaned)) < self.min_sentences:
            failed.append("c4_too_few_sentences")
        return cleaned, failed

    def _keep_line(self, line: str) -> bool:
        if not line:
            return False
        lowered = line.lower()
        if self.drop_lines_without_terminal_punctuation and not line.endswith(_TERMINAL):
            return False
        if len(line.split()) < self.min_words_per_line:
            return False
        if self.drop_javascript_lines and "javascript" in lowered:
            return False
        if self.drop_policy_lines and any(p in lowered for p in _POLICY):
            return False
        return True


GOPHER = GopherRules()
C4 = C4Rules()


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
            attributes["c4_lines_dropped"] = len([line for line in text.split("\n") if line.strip()]) - len(
                [line for line in cleaned.split("\n") if line.strip()])
            if self.rewrite:
                attributes[text_field] = cleaned
                text = cleaned
        if self.gopher is not None:
            failed.extend(self.gopher.failures(text))
        attributes["failed_rules"] = failed
        return Verdict(not failed, failed[0] if failed else None, None, attributes)


def quality_filtered(
    name: str,
    source: Any,
    *,
    gopher: GopherRules | None = GOPHER,
    c4: C4Rules | None = C4,
    rewrite: bool = True,
    **options: Unpack[StepOptions],
) -> LazyStep:
    """A lazy step applying the C4 and Gopher rules (either may be ``None``); reasons name the rule."""
    rules = QualityRules(gopher, c4, rewrite)
    return rule_step(name, "quality_heuristics", source, rules, **options)
