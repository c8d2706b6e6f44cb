"""The Gopher quality rules (Rae et al. 2021, appendix A): document-level bounds and repetition.

A document fails a rule when a measure crosses the paper's threshold (Table A1 for repetition).
Two repetition measures need a reading the paper states only in words, and this module takes
the one its wording supports (docs/data-curation.md, "Quality filtering", gives the reasoning):

- *top n-gram* (n = 2, 3, 4): the share of the document's characters inside the single most
  frequent n-gram, every occurrence of it included (first in the text among equally frequent
  ones; only when it occurs more than once).
- *duplicate n-grams* (n = 5 .. 10): the share of characters inside occurrences of an n-gram that
  already occurred earlier in the document. The first occurrence is the original, not a
  duplicate, just as a duplicate line is a line that repeats an earlier one.

In both, a character covered by several (overlapping) occurrences counts once: coverage is the
union of the covered word positions. Characters are those of the words (whitespace-separated,
lower-cased for comparison), so the measures do not depend on how the text is spaced.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate

_WORD = re.compile(r"\S+")
_ALPHA = re.compile(r"[^\W\d_]")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_BULLETS = ("•", "●", "○", "■", "□", "▪", "▫", "–", "-", "*", "·", "‣", "⁃", "◦")
_ELLIPSES = ("...", "…")

# What the rules measure, as opposed to their thresholds: raised whenever a definition changes, so
# a step's identity changes with it and outputs made under an earlier definition are not reused.
# 2: duplicate n-grams count only repeats of an earlier occurrence; coverage is a union of positions.
GOPHER_DEFINITION = 2


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
    # n -> the most frequent n-gram's share of characters (all its occurrences)
    max_top_ngram_chars: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    # n -> the share of characters in repeats of an n-gram seen earlier in the document
    max_duplicate_ngram_chars: tuple[tuple[int, float], ...] = (
        (5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10),
    )
    definition: int = field(default=GOPHER_DEFINITION, init=False)

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
        if lines and sum(line.endswith(_ELLIPSES) for line in lines) / len(lines) > self.max_ellipsis_lines:
            failed.append("gopher_ellipsis_lines")
        if sum(bool(_ALPHA.search(w)) for w in words) / len(words) < self.min_alpha_words:
            failed.append("gopher_alpha_words")
        lowered = {w.lower().strip(".,;:!?\"'()") for w in words}
        if sum(s in lowered for s in self.stop_words) < self.min_stop_words:
            failed.append("gopher_stop_words")
        failed.extend(self._repeated_units(text, lines))
        failed.extend(self._repeated_ngrams([w.lower() for w in words]))
        return failed

    def _repeated_units(self, text: str, lines: list[str]) -> list[str]:
        failed = []
        paragraphs = [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
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
        return failed

    def _repeated_ngrams(self, words: list[str]) -> list[str]:
        failed = []
        fractions = ngram_fractions(words, [n for n, _ in self.max_top_ngram_chars],
                                    [n for n, _ in self.max_duplicate_ngram_chars])
        for n, limit in self.max_top_ngram_chars:
            if fractions.top[n] > limit:
                failed.append(f"gopher_top_{n}gram_chars")
        for n, limit in self.max_duplicate_ngram_chars:
            if fractions.duplicate[n] > limit:
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


@dataclass(frozen=True)
class NgramFractions:
    """Shares of a document's word characters: ``top[n]`` and ``duplicate[n]`` (see the module's opening)."""

    top: dict[int, float]
    duplicate: dict[int, float]


def ngram_fractions(words: list[str], top_sizes: Iterable[int], duplicate_sizes: Iterable[int]) -> NgramFractions:
    """The top and duplicate n-gram character fractions of ``words`` (already normalised for comparison)."""
    top_sizes, duplicate_sizes = set(top_sizes), set(duplicate_sizes)
    starts = [0, *accumulate(len(w) for w in words)]  # starts[i]: characters before word i
    total = starts[-1] or 1
    top: dict[int, float] = {}
    duplicate: dict[int, float] = {}
    for n, grams in _ngram_ids(words, max(top_sizes | duplicate_sizes, default=0)):
        if n in top_sizes:
            top[n] = _top_chars(grams, n, starts) / total
        if n in duplicate_sizes:
            duplicate[n] = _repeat_chars(grams, n, starts) / total
    return NgramFractions({n: top.get(n, 0.0) for n in top_sizes}, {n: duplicate.get(n, 0.0) for n in duplicate_sizes})


def _ngram_ids(words: list[str], largest: int):
    """``(n, ids)`` for n = 1 .. ``largest``: ``ids[i]`` is where the n-gram starting at word i first occurs.

    So an occurrence at ``i`` repeats an earlier one exactly when ``ids[i] != i``. An n-gram is the
    (n-1)-gram at the same start and one more word, so each size costs one pass over pairs of
    ints, however large n is.
    """
    first: dict = {}
    unigrams = [first.setdefault(w, i) for i, w in enumerate(words)]
    ids = unigrams
    for n in range(1, largest + 1):
        if n > 1:
            first = {}
            ids = [first.setdefault(pair, i) for i, pair in enumerate(zip(ids, unigrams[n - 1:]))]
        if not ids:
            return
        yield n, ids


def _covered_chars(starting_positions: Iterable[int], n: int, starts: list[int]) -> int:
    """Characters of the words covered by n-grams starting at increasing positions, each counted once."""
    chars, covered_to = 0, 0
    for i in starting_positions:
        begin = max(i, covered_to)
        if i + n > begin:
            chars += starts[i + n] - starts[begin]
            covered_to = i + n
    return chars


def _top_chars(grams: list[int], n: int, starts: list[int]) -> int:
    gram, count = Counter(grams).most_common(1)[0]  # counted in order of first occurrence: ties go to the first
    if count < 2:
        return 0
    return _covered_chars((i for i, g in enumerate(grams) if g == gram), n, starts)


def _repeat_chars(grams: list[int], n: int, starts: list[int]) -> int:
    return _covered_chars((i for i, first in enumerate(grams) if first != i), n, starts)


GOPHER = GopherRules()
