"""Plot shapes by name: each one writes a whole story into a StoryWriter, beat by beat.

The cast and the slots are set up by :func:`~storygen.beats.cast_story` before a plot runs. The
shapes themselves live in :mod:`storygen.adventure_plots` and :mod:`storygen.friendship_plots`.
"""

from __future__ import annotations

from collections.abc import Callable

from storygen.adventure_plots import fear_overcome, lesson_learned, lost_and_found, rescue, trip
from storygen.friendship_plots import gift, misunderstanding, new_friend, sharing
from storygen.writer import StoryWriter

PLOTS: dict[str, Callable[[StoryWriter], None]] = {
    "lost_and_found": lost_and_found,
    "sharing": sharing,
    "fear_overcome": fear_overcome,
    "trip": trip,
    "misunderstanding": misunderstanding,
    "lesson_learned": lesson_learned,
    "new_friend": new_friend,
    "gift": gift,
    "rescue": rescue,
}
