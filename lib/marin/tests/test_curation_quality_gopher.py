"""Gopher's n-gram repetition measures (Rae et al. 2021, appendix A, Table A1), on worked examples whose
figures are computed by hand below, and on the real TinyStories sample."""

from __future__ import annotations

import json

from marin.curation.quality_gopher import GOPHER, ngram_fractions

PHRASE = "bird sang from tall tree".split()
# 50 distinct four-letter words; two are stop words so the document passes Gopher's stop-word rule.
FILLERS = ["that", "with", *(f"w{i:03d}" for i in range(48))]


def test_duplicate_ngrams_count_the_repeats_not_the_first_occurrence():
    """A 5-word phrase twice among 50 distinct words: 60 words of 4 letters, 240 characters.

    The only repeated 5-gram is the phrase (every 5-gram across its edges meets distinct fillers),
    so the repeats are its second occurrence: 5 x 4 = 20 characters, 20 / 240 = 1/12 = 0.083,
    under the 5-gram limit of 0.15. Counting both occurrences would give 40 / 240 = 0.167 and
    remove the document. No 6- to 10-gram repeats (the words around the two copies differ): 0.

    The top n-grams count every occurrence: the first of the equally frequent 2-grams of the
    phrase, "bird sang", occurs twice, 2 x 8 = 16 characters, 16 / 240 = 0.067 (limit 0.20); the
    top 3-gram 2 x 12 = 24, 0.1 (limit 0.18); the top 4-gram 2 x 16 = 32, 0.133 (limit 0.16).
    """
    words = PHRASE + FILLERS[:25] + PHRASE + FILLERS[25:]
    assert len(words) == 60 and len(set(FILLERS)) == 50 and all(len(w) == 4 for w in words)
    fractions = ngram_fractions(words, (2, 3, 4), range(5, 11))
    assert fractions.duplicate == {5: 20 / 240, 6: 0.0, 7: 0.0, 8: 0.0, 9: 0.0, 10: 0.0}
    assert fractions.top == {2: 16 / 240, 3: 24 / 240, 4: 32 / 240}
    assert GOPHER.failures(" ".join(words)) == []


def test_a_third_copy_crosses_the_limit():
    """The phrase three times among the same 50 words: 65 words, 260 characters. The second and
    third copies repeat the first: 2 x 20 = 40 characters, 40 / 260 = 0.154 > 0.15, so the 5-gram
    rule fails. The top n-grams occur three times: 3 x 8 = 24 (0.092), 3 x 12 = 36 (0.138) and
    3 x 16 = 48 characters, 48 / 260 = 0.185 > 0.16, so the top 4-gram rule fails too."""
    words = PHRASE + FILLERS[:25] + PHRASE + FILLERS[25:] + PHRASE
    fractions = ngram_fractions(words, (2, 3, 4), (5, 6))
    assert fractions.duplicate == {5: 40 / 260, 6: 0.0}
    assert fractions.top == {2: 24 / 260, 3: 36 / 260, 4: 48 / 260}
    assert GOPHER.failures(" ".join(words)) == ["gopher_top_4gram_chars", "gopher_duplicate_5gram_chars"]


def test_overlapping_occurrences_count_each_character_once():
    """"hush" seven times, then 23 distinct fillers: 30 words of 4 letters, 120 characters.

    5-grams: those starting at words 0, 1 and 2 are all "hush x 5"; the one at 0 is the original,
    the repeats at 1 and 2 cover words 1-5 and 2-6, together words 1-6: 6 x 4 = 24 characters,
    24 / 120 = 0.2 (adding the two repeats up would say 40, 0.333). 6-grams: starts 0 and 1 are
    "hush x 6"; the repeat covers words 1-6, again 24 / 120 = 0.2. 7-grams: only one "hush x 7": 0.

    Top 2-gram: "hush hush" starts at words 0-5 (6 times) and covers words 0-6: 28 characters,
    28 / 120 = 0.233 (6 x 8 = 48 if overlaps counted twice); top 3- and 4-grams cover the same
    seven words: 28 / 120.
    """
    words = ["hush"] * 7 + FILLERS[2:25]
    assert len(words) == 30
    fractions = ngram_fractions(words, (2, 3, 4), (5, 6, 7))
    assert fractions.duplicate == {5: 24 / 120, 6: 24 / 120, 7: 0.0}
    assert fractions.top == {2: 28 / 120, 3: 28 / 120, 4: 28 / 120}


def test_an_ngram_seen_once_is_no_top_ngram():
    fractions = ngram_fractions(FILLERS[:10], (2,), (5,))
    assert fractions.top == {2: 0.0} and fractions.duplicate == {5: 0.0}
    assert ngram_fractions(["too", "few"], (3,), (5,)).top == {3: 0.0}


def test_repetition_rules_remove_under_one_percent_of_real_tinystories(real_data):
    """Stories for children repeat their phrases ("once upon a time", a refrain) without being
    degenerate text: at most 1% of the sample's 1,800 stories should fail an n-gram repetition rule
    (counting every occurrence of a repeated n-gram, as this module once did, failed 31: 1.7%; now 6)."""
    stories = [json.loads(line)["text"] for line in real_data.train.read_text(encoding="utf-8").splitlines()]
    failing = [s for s in stories if any("gram" in rule for rule in GOPHER.failures(s))]
    assert len(stories) == 1800 and len(failing) <= 18
