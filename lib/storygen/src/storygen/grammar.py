"""Small grammar helpers: articles, pronouns, sentence assembly and dialogue punctuation.

Templates are written in the past tense with named slots such as ``{hero}``, ``{hero.his}`` or
``{thing.a}``; the objects here supply the right word for each slot, so a template never has to
know whether its hero is a girl, a boy, a dog or a teddy bear.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# Words spelled with a leading vowel letter but spoken with a consonant sound, and the reverse.
_CONSONANT_SOUND_VOWELS = ("uni", "use", "usu", "uku", "one", "once", "euro", "ewe")
_VOWEL_SOUND_CONSONANTS = ("hour", "honest", "honor", "heir")


def indefinite_article(phrase: str) -> str:
    """'a' or 'an' for the phrase, decided by the sound of its first word."""
    word = phrase.lower()
    if word.startswith(_VOWEL_SOUND_CONSONANTS):
        return "an"
    if word.startswith(_CONSONANT_SOUND_VOWELS):
        return "a"
    return "an" if word[:1] in "aeiou" else "a"


def with_article(phrase: str) -> str:
    return f"{indefinite_article(phrase)} {phrase}"


_PRONOUNS = {
    "female": ("she", "her", "her", "herself"),
    "male": ("he", "him", "his", "himself"),
}


@dataclass(frozen=True)
class Character:
    """A named character; its attributes are the words templates need to refer to it."""

    name: str
    gender: str  # "female" or "male"; decides every pronoun
    kind: str  # "little girl", "puppy", "teddy bear", ...
    trait: str  # an adjective: "brave", "shy", ...
    is_child: bool = False
    # For animals: how it moves, the sound it makes, what it eats (past tense verbs, a noun).
    moves: str = ""
    sound: str = ""
    eats: str = ""

    def __str__(self) -> str:
        return self.name

    @property
    def Name(self) -> str:  # noqa: N802 - a template slot at the start of a sentence
        return self.name[:1].upper() + self.name[1:]

    @property
    def he(self) -> str:
        return _PRONOUNS[self.gender][0]

    @property
    def He(self) -> str:  # noqa: N802 - a template slot at the start of a sentence
        return self.he.capitalize()

    @property
    def him(self) -> str:
        return _PRONOUNS[self.gender][1]

    @property
    def his(self) -> str:
        return _PRONOUNS[self.gender][2]

    @property
    def His(self) -> str:  # noqa: N802 - a template slot at the start of a sentence
        return self.his.capitalize()

    @property
    def himself(self) -> str:
        return _PRONOUNS[self.gender][3]

    @property
    def a_kind(self) -> str:
        """'a little girl', 'an owl', 'a shy puppy'."""
        return with_article(self.kind)

    @property
    def a_trait_kind(self) -> str:
        return with_article(f"{self.trait} {self.kind}")

    @property
    def possessive(self) -> str:
        return f"{self.name}'" if self.name.endswith("s") else f"{self.name}'s"


@dataclass(frozen=True)
class Thing:
    """An object with an optional describing word: 'a shiny red ball', 'the ball'."""

    noun: str
    description: str = ""

    def __str__(self) -> str:
        return self.noun

    @property
    def full(self) -> str:
        return f"{self.description} {self.noun}".strip()

    @property
    def a(self) -> str:
        return with_article(self.full)

    @property
    def the(self) -> str:
        return f"the {self.noun}"

    @property
    def the_full(self) -> str:
        return f"the {self.full}"


_SENTENCE_START = re.compile(r"([.!?] )([a-z])")


def sentence(text: str) -> str:
    """Capitalise each sentence's first letter and make sure the text ends with punctuation.

    A sentence end is a terminator followed by a space; a terminator inside a quotation is
    followed by the closing quote instead, so '"Where is it?" asked Tom.' keeps its lowercase verb.
    """
    text = text.strip()
    if not text:
        return text
    first = 1 if text[0] == '"' else 0
    text = text[:first] + text[first].upper() + text[first + 1 :]
    text = _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2).upper(), text)
    if text[-1] not in '.!?"':
        text += "."
    return text


_SPEECH_VERBS = ("said", "said", "said", "asked", "shouted", "whispered", "cried", "called", "replied")


def quote(rng: random.Random, speaker: str, line: str, verb: str | None = None) -> str:
    """A line of dialogue with correct punctuation, the speaker before or after the quote.

    A question is 'asked'; the verb otherwise is the caller's or 'said'. When the speaker comes
    after the quote, a closing period inside the quote becomes a comma.
    """
    line = line.strip()
    line = line[0].upper() + line[1:]
    if line[-1] not in ".!?":
        line += "."
    if verb is None:
        verb = "asked" if line.endswith("?") else "said"
    if rng.random() < 0.5:
        return f'{speaker} {verb}, "{line}"'
    inner = line[:-1] + "," if line.endswith(".") else line
    return f'"{inner}" {verb} {speaker}.'


def join_list(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
