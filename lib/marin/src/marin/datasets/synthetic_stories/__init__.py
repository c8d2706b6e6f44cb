"""A generator of short, simple stories for small children, in the style of TinyStories.

It is the project's own offline stand-in for the ``roneneldan/TinyStories`` dataset: stories are
built from a grammar of templates with slots (characters, places, objects, feelings, dialogue)
over several plot shapes, and are fully determined by ``(seed, index)``.

    >>> from marin.datasets.synthetic_stories import generate_stories
    >>> texts = generate_stories(3, seed=0)
"""

from marin.datasets.synthetic_stories.generator import (
    GENERATOR_VERSION,
    MAX_WORDS,
    MIN_WORDS,
    Story,
    generate_stories,
    iter_stories,
    story,
)
from marin.datasets.synthetic_stories.plots import PLOTS

GENERATOR_NAME = "marin.synthetic_stories"
PLOT_NAMES = tuple(sorted(PLOTS))

__all__ = [
    "GENERATOR_NAME",
    "GENERATOR_VERSION",
    "MAX_WORDS",
    "MIN_WORDS",
    "PLOT_NAMES",
    "Story",
    "generate_stories",
    "iter_stories",
    "story",
]
