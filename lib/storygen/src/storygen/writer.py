"""The per-story state a plot writes into: the cast, the slots, and the paragraphs written so far."""

from __future__ import annotations

import random
from dataclasses import dataclass

from storygen import lexicon
from storygen.grammar import Character, Thing, quote, sentence


@dataclass(frozen=True)
class Place:
    name: str
    spots: tuple[str, ...]
    sights: tuple[str, ...]

    def __str__(self) -> str:
        return self.name


class StoryWriter:
    """Collects sentences for one story.

    ``detail`` scales the chance of optional sentences, so a story that comes out too long can be
    rewritten more tersely from a fresh random stream, deterministically.
    """

    def __init__(self, rng: random.Random, detail: float = 1.0):
        self.rng = rng
        self.detail = detail
        self.paragraphs: list[list[str]] = [[]]
        self.slots: dict[str, object] = {}
        self._cast_names: set[str] = set()

    # -- choices -----------------------------------------------------------------------------

    def pick(self, options):
        return options[self.rng.randrange(len(options))]

    def sample(self, options, k: int) -> list:
        return self.rng.sample(list(options), k)

    def maybe(self, probability: float) -> bool:
        return self.rng.random() < probability * self.detail

    # -- the cast ------------------------------------------------------------------------------

    def _fresh_name(self, names: tuple[str, ...]) -> str:
        while True:
            name = self.pick(names)
            if name not in self._cast_names:
                self._cast_names.add(name)
                return name

    def child(self) -> Character:
        if self.rng.random() < 0.5:
            return Character(self._fresh_name(lexicon.GIRL_NAMES), "female", self.pick(lexicon.GIRL_KINDS),
                             self.pick(lexicon.TRAITS), is_child=True)
        return Character(self._fresh_name(lexicon.BOY_NAMES), "male", self.pick(lexicon.BOY_KINDS),
                         self.pick(lexicon.TRAITS), is_child=True)

    def animal(self) -> Character:
        species, moves, sound, eats = self.pick(lexicon.ANIMALS)
        gender = self.pick(("female", "male"))
        return Character(self._fresh_name(lexicon.PET_NAMES), gender, species, self.pick(lexicon.TRAITS),
                         moves=moves, sound=sound, eats=eats)

    def toy(self) -> Character:
        kind, look = self.pick(lexicon.TOYS)
        gender = self.pick(("female", "male"))
        return Character(self._fresh_name(lexicon.PET_NAMES), gender, f"{look} {kind}", self.pick(lexicon.TRAITS))

    def anyone(self, child_weight: float = 0.65, animal_weight: float = 0.25) -> Character:
        roll = self.rng.random()
        if roll < child_weight:
            return self.child()
        if roll < child_weight + animal_weight:
            return self.animal()
        return self.toy()

    def grown_up(self) -> Character:
        name, gender = self.pick(lexicon.ADULTS)
        return Character(name, gender, "grown-up", "kind")

    def thing(self, nouns: tuple[str, ...] = lexicon.OBJECTS) -> Thing:
        noun = self.pick(nouns)
        roll = self.rng.random()
        if roll < 0.35:
            description = self.pick(lexicon.COLORS)
        elif roll < 0.7:
            description = self.pick(lexicon.OBJECT_ADJECTIVES)
        else:
            description = f"{self.pick(lexicon.OBJECT_ADJECTIVES)} {self.pick(lexicon.COLORS)}"
        return Thing(noun, description)

    def place(self) -> Place:
        name, spots, sights = self.pick(lexicon.PLACES)
        return Place(name, spots, sights)

    # -- writing -------------------------------------------------------------------------------

    def fill(self, template: str) -> str:
        return template.format(**self.slots)

    def add(self, template: str) -> None:
        """Add one or more sentences (a template with slots) to the current paragraph."""
        self.paragraphs[-1].append(sentence(self.fill(template)))

    def one_of(self, *templates: str) -> None:
        self.add(self.pick(templates))

    def say(self, speaker: Character | str, *lines: str, verb: str | None = None) -> None:
        """A line of dialogue; with several lines given, one is chosen.

        ``speaker`` is a Character or the name of a slot holding one (``"hero"``).
        """
        line = self.fill(self.pick(lines))
        if isinstance(speaker, str) and isinstance(self.slots.get(speaker), Character):
            speaker = self.slots[speaker]  # a slot name such as "hero"
        speaker_text = speaker.name if isinstance(speaker, Character) else speaker
        self.paragraphs[-1].append(sentence(quote(self.rng, speaker_text, line, verb)))

    def paragraph(self) -> None:
        if self.paragraphs[-1]:
            self.paragraphs.append([])

    def text(self) -> str:
        return "\n".join(" ".join(p) for p in self.paragraphs if p)
