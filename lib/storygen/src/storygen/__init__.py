"""A generator of short, simple stories for small children, in the style of TinyStories.

It is the project's own offline stand-in for the ``roneneldan/TinyStories`` dataset: stories are
built from a grammar of templates with slots (characters, places, objects, feelings, dialogue)
over several plot shapes, and are fully determined by ``(seed, index)``. The package depends on
nothing but the standard library, so any layer (and any test) can use it.

    >>> from storygen import generate_stories
    >>> texts = generate_stories(3, seed=0)
"""

from storygen.generator import (
    GENERATOR_VERSION,
    MAX_WORDS,
    MIN_WORDS,
    Story,
    generate_stories,
    iter_stories,
    story,
)
from storygen.plots import PLOTS

# The generator's name as recorded in the built-in corpus's identity (and so in every hash derived
# from it). It predates this package's own name and stays as it is: changing it would orphan every
# cached corpus, tokenizer and model built on the generated text.
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
