"""The C4 clean-up (Raffel et al. 2020, section 2.2), applied line by line as its reference applies it.

Each line, stripped, meets the rules in this order (the order of the public implementation in
TensorFlow Datasets, ``c4_utils.clean_page``):

1. a line with a word longer than ``max_word_length`` characters is dropped;
2. citation markers (``[1]``, ``[]``, ``[edit]``, ``[citation needed]``) are cut out of it;
3. a line that does not end in ``.``, ``?``, ``!`` or ``"``, or ends in ``...``, is dropped;
4. a line of fewer than ``min_words_per_line`` words is dropped;
5. "lorem ipsum" in a line still standing removes the page;
6. a line mentioning "javascript" is dropped;
7. a ``{`` in a line still standing removes the page;
8. a line with a policy phrase (terms of use, privacy policy, cookie policy, uses cookies, use of
   cookies, use cookies) is dropped;

and the page is removed when the lines left hold fewer than ``min_sentences`` sentences. So the
page rules (5, 7) look only at lines the earlier rules kept: a ``{`` in a menu line without
punctuation, or in a javascript notice, removes nothing. The reference stops at the first page
rule; here the scan goes on so ``failed_rules`` can list every rule, and the first one named is
the reference's reason. Not applied: the bad-words list (a download) and the data set's
three-sentence deduplication (the dedup steps' work).

Sentences: the reference counts them with NLTK's punkt model, which is a download; here a line
holds one sentence per run of ``.``, ``!`` or ``?`` (closing quotes and brackets allowed after it)
that ends the line or is followed by a space and then not a lower-case letter, and at least one,
since every kept line ends in an end mark. The two differ on abbreviations before a capital
("Mr. Smith" is two sentences here, one for punkt).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_CITATION = re.compile(r"\[(?:\d*|edit|citation needed)\]")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s*$|\s+[^\sa-z])")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")

# What the rules do, as opposed to their settings (see quality_gopher.GOPHER_DEFINITION).
# 2: the reference's line-first order; "..." lines dropped; citations cut; page rules on kept lines.
C4_DEFINITION = 2


@dataclass(frozen=True)
class C4Rules:
    """The C4 clean-up's settings (the reference's values by default); ``False`` turns a rule off."""

    max_word_length: int = 1000
    remove_citations: bool = True
    end_marks: tuple[str, ...] = (".", "?", "!", '"')
    drop_lines_without_terminal_punctuation: bool = True  # and lines ending in "..."
    min_words_per_line: int = 5
    remove_lorem_ipsum: bool = True
    drop_javascript_lines: bool = True
    remove_curly_braces: bool = True
    drop_policy_lines: bool = True
    min_sentences: int = 3
    definition: int = field(default=C4_DEFINITION, init=False)

    def clean(self, text: str) -> tuple[str, list[str]]:
        """``(the kept lines, joined by newlines; names of the page rules it fails, first one first)``."""
        failed: list[str] = []
        kept: list[str] = []
        sentences = 0
        for raw in text.splitlines():
            line, page_rules = self._line(raw.strip())
            failed.extend(rule for rule in page_rules if rule not in failed)
            if line is not None and not page_rules:
                kept.append(line)
                sentences += max(1, len(_SENTENCE_END.findall(line)))
        if sentences < self.min_sentences:
            failed.append("c4_too_few_sentences")
        return "\n".join(kept).strip(), failed

    def _line(self, line: str) -> tuple[str | None, list[str]]:
        """The line as kept (``None`` when dropped), and the page rules it trips, in the reference's order."""
        if len(line) > self.max_word_length and any(len(word) > self.max_word_length for word in line.split()):
            return None, []
        if self.remove_citations:
            line = _CITATION.sub("", line)
        if self.drop_lines_without_terminal_punctuation and (not line.endswith(self.end_marks) or line.endswith("...")):
            return None, []
        if len(line.split()) < self.min_words_per_line:
            return None, []
        lowered = line.lower()
        page_rules = []
        if self.remove_lorem_ipsum and "lorem ipsum" in lowered:
            page_rules.append("c4_lorem_ipsum")
        if self.drop_javascript_lines and "javascript" in lowered:
            return None, page_rules
        if self.remove_curly_braces and "{" in line:
            page_rules.append("c4_curly_brace")
        if self.drop_policy_lines and any(phrase in lowered for phrase in _POLICY):
            return None, page_rules
        return line, page_rules


C4 = C4Rules()
