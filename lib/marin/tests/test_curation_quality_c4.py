"""C4's clean-up, one test per rule, in the reference's order (Raffel et al. 2020, section 2.2, and
TensorFlow Datasets' c4_utils.clean_page). Every page is written out here and every test states the
text that survives, exactly."""

from __future__ import annotations

from dataclasses import replace

from marin.curation.quality_c4 import C4

# Three lines every rule keeps: five words or more, a final period, one sentence each (the minimum).
BODY = [
    "The river ran past the old mill all year.",
    "Children fished from the bridge on warm days.",
    "In winter the water froze along both banks.",
]


def page(*extra: str) -> str:
    return "\n".join([*BODY, *extra])


def kept(*extra: str) -> str:
    return "\n".join([*BODY, *extra])


def test_a_line_with_a_word_over_1000_characters_is_dropped():
    long_word, longest_kept = "x" * 1001, "y" * 1000
    cleaned, failed = C4.clean(page(f"A line with {long_word} in it.", f"A line with {longest_kept} in it."))
    assert (cleaned, failed) == (kept(f"A line with {longest_kept} in it."), [])


def test_citation_markers_are_cut_before_the_punctuation_rule():
    cleaned, failed = C4.clean(page(
        "The mill was built in 1820.[1] It burned down twice.[citation needed]",
        "The old mill is still there today.[12]",
        "History of the mill and its owners[edit]",  # no end mark once the marker is gone
        "An empty marker [] goes too, as the reference does.",
        "A footnote [a] is not a citation marker here.",
    ))
    assert failed == []
    assert cleaned == kept(
        "The mill was built in 1820. It burned down twice.",
        "The old mill is still there today.",
        "An empty marker  goes too, as the reference does.",
        "A footnote [a] is not a citation marker here.",
    )


def test_a_line_without_terminal_punctuation_is_dropped():
    cleaned, failed = C4.clean(page(
        "Did the miller ever sell the mill?",
        "What a fine old mill it is!",
        'He said "the mill is not for sale"',
        "Read more about the mill here",
        "The mill, the bridge and the river:",
        "She said “we will see.”",  # a typographic closing quote is not one of the reference's end marks
        "It was the miller's, not the baker's'",
    ))
    assert failed == []
    assert cleaned == kept("Did the miller ever sell the mill?", "What a fine old mill it is!",
                           'He said "the mill is not for sale"')
    typographic = replace(C4, end_marks=(*C4.end_marks, "”"))
    assert typographic.clean(page("She said “we will see.”")) == (kept("She said “we will see.”"), [])


def test_a_line_ending_in_an_ellipsis_is_dropped():
    cleaned, failed = C4.clean(page(
        "And so the story of the mill goes on...",
        "They waited.... Then the miller came home.",
        "It ended there and nobody said a word....",
    ))
    assert (cleaned, failed) == (kept("They waited.... Then the miller came home."), [])


def test_a_line_of_fewer_than_five_words_is_dropped():
    cleaned, failed = C4.clean(page("Too short to keep.", "Five words make a line."))
    assert (cleaned, failed) == (kept("Five words make a line."), [])
    assert C4.clean(page("Three words here."))[0] == kept()
    assert replace(C4, min_words_per_line=3).clean(page("Three words here."))[0] == kept("Three words here.")


def test_lorem_ipsum_removes_the_page_only_on_a_line_the_earlier_rules_kept():
    removed = page("Lorem ipsum dolor sit amet, consectetur adipiscing elit.")
    assert C4.clean(removed) == (kept(), ["c4_lorem_ipsum"])
    # Without an end mark, or too short, the line goes and the page stays.
    assert C4.clean(page("Lorem ipsum dolor sit amet", "Lorem ipsum dolor.")) == (kept(), [])


def test_a_line_mentioning_javascript_is_dropped():
    cleaned, failed = C4.clean(page("Please enable JavaScript to see the comments.", "Our javascript-free page loads fast."))
    assert (cleaned, failed) == (kept(), [])


def test_lorem_ipsum_is_checked_before_javascript():
    assert C4.clean(page("The lorem ipsum text needs javascript to show."))[1] == ["c4_lorem_ipsum"]


def test_a_curly_bracket_removes_the_page_only_on_a_line_the_earlier_rules_kept():
    assert C4.clean(page("Write the set as {1, 2, 3} in your notes.")) == (kept(), ["c4_curly_brace"])
    cleaned, failed = C4.clean(page(
        "var settings = {theme: 1}",  # no end mark: dropped before the bracket is seen
        "Turn on javascript so that {this} works.",  # javascript lines go before the bracket rule
        "The set closes with a } sign here.",  # only the opening bracket counts
    ))
    assert (cleaned, failed) == (kept("The set closes with a } sign here."), [])


def test_a_policy_line_is_dropped():
    cleaned, failed = C4.clean(page(
        "By using this site you agree to our Terms of Use.",
        "This site uses cookies to work well.",
        "Read our privacy policy before you sign up.",
        "We use cookies for the good things only.",
        "The cookie jar at the mill was always full.",
    ))
    assert (cleaned, failed) == (kept("The cookie jar at the mill was always full."), [])


def test_the_curly_bracket_rule_comes_before_the_policy_rule():
    assert C4.clean(page("Read the privacy policy at {link} today."))[1] == ["c4_curly_brace"]


def test_a_page_with_fewer_than_three_sentences_left_is_removed():
    two = "\n".join(BODY[:2])
    assert C4.clean(two + "\nHome | About | Contact") == (two, ["c4_too_few_sentences"])
    # Sentences, not lines: one line of three sentences is enough ("3.5" ends none).
    three = "It rained for 3.5 days. We stayed in. The mill was quiet!"
    assert C4.clean(three) == (three, [])
    assert C4.clean('He asked "why?" and left. She stayed.')[1] == ["c4_too_few_sentences"]


def test_every_page_rule_is_listed_and_the_first_is_the_references_reason():
    text = page("Write the set as {1, 2, 3} in your notes.", "Lorem ipsum dolor sit amet, consectetur adipiscing elit.")
    cleaned, failed = C4.clean(text)
    assert failed == ["c4_curly_brace", "c4_lorem_ipsum"] and cleaned == kept()
    assert C4.clean("Lorem ipsum dolor sit amet, consectetur adipiscing elit.")[1] == ["c4_lorem_ipsum", "c4_too_few_sentences"]


def test_rules_turn_off_one_at_a_time():
    text = page("And so the story of the mill goes on...", "Please enable JavaScript to see the comments.")
    assert replace(C4, drop_lines_without_terminal_punctuation=False).clean(text)[0] == kept(
        "And so the story of the mill goes on...")
    assert replace(C4, drop_javascript_lines=False).clean(text)[0] == kept("Please enable JavaScript to see the comments.")
    assert replace(C4, remove_curly_braces=False).clean(page("Write the set as {1, 2, 3} in your notes.")) == (
        kept("Write the set as {1, 2, 3} in your notes."), [])
