"""Deterministic assembly of whole stories: one independent random stream per story index.

Story ``i`` of seed ``s`` depends only on ``(s, i)``, so any range of a corpus can be produced on
its own (by a shard, or after a restart) and always reads the same.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from storygen import lexicon
from storygen.beats import cast_story
from storygen.grammar import Character
from storygen.plots import PLOTS
from storygen.writer import StoryWriter

# Bumped whenever a change to the lexicon, grammar or plots changes any generated text: it is
# part of the built-in corpus's identity, so cached corpora and everything built from them are
# rebuilt rather than silently mixed with the new text.
GENERATOR_VERSION = "1"

MIN_WORDS = 100
MAX_WORDS = 300
_MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class Story:
    index: int
    plot: str
    text: str
    # (name, gender) of every character in the story, for checks and analysis.
    characters: tuple[tuple[str, str], ...] = ()

    @property
    def word_count(self) -> int:
        return len(self.text.split())


def _write(rng: random.Random, plot: str, detail: float) -> tuple[str, tuple[tuple[str, str], ...]]:
    writer = StoryWriter(rng, detail)
    cast_story(writer)
    PLOTS[plot](writer)
    if len(writer.text().split()) < MIN_WORDS:
        _add_episode(writer)
    cast = {c.name: c.gender for c in writer.slots.values() if isinstance(c, Character)}
    return writer.text(), tuple(sorted(cast.items()))


def _add_episode(w: StoryWriter) -> None:
    """A short extra scene for a story that came out too short."""
    w.paragraph()
    w.slots["extra_activity"] = w.pick(lexicon.ACTIVITIES)
    w.one_of(
        "Later that day, {hero} and {friend} {extra_activity}. They laughed so much that their tummies hurt.",
        "The next day, {hero} went back to {place} with {friend}. They {extra_activity} and had lots of fun.",
        "Before bed, {hero} told {adult} all about the day. {adult} smiled and said {hero} had done well.",
    )
    w.one_of(
        "{hero} felt {happy}, and {hero.he} could not wait for the next day.",
        "It had been a long day, and {hero} was tired but {happy}.",
    )


def story(index: int, *, seed: int) -> Story:
    """Story number ``index`` of the corpus with this seed."""
    plot_names = sorted(PLOTS)
    for attempt in range(_MAX_ATTEMPTS):
        # A string seed is hashed with SHA-512 by `random`, so the stream is the same on every
        # platform and Python run (unlike hash()-based seeding).
        rng = random.Random(f"synthetic-stories:{seed}:{index}:{attempt}")
        plot = plot_names[rng.randrange(len(plot_names))]
        text, cast = _write(rng, plot, detail=max(0.0, 1.0 - 0.25 * attempt))
        if MIN_WORDS <= len(text.split()) <= MAX_WORDS:
            return Story(index, plot, text, cast)
    raise AssertionError(f"story {index} of seed {seed} did not fit {MIN_WORDS}-{MAX_WORDS} words")


def iter_stories(count: int | None = None, *, seed: int, start: int = 0) -> Iterator[Story]:
    """Stories ``start, start + 1, ...``: ``count`` of them, or endlessly when ``count`` is None."""
    index = start
    while count is None or index < start + count:
        yield story(index, seed=seed)
        index += 1


def generate_stories(count: int, *, seed: int, start: int = 0) -> list[str]:
    """The texts of ``count`` stories; the same arguments always give the same list."""
    return [s.text for s in iter_stories(count, seed=seed, start=start)]
