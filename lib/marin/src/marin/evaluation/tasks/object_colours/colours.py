"""Data of the ``marin_object_colours`` task: the rule, its test items, and text that teaches it.

The test items live in ``object_colours.jsonl`` (written by :func:`write_test_items`, kept in the
repository so the task is fixed); :func:`training_text` writes sentences that follow the same rule
for other story numbers, so a model that scores well has learnt the rule, not the test items.
"""

from __future__ import annotations

import json
import os

COLOURS = ("red", "blue", "green", "yellow")
# Two objects per colour, so a model that always answers one colour scores exactly chance (25%).
OBJECT_COLOURS = {
    "apple": "red", "rose": "red",
    "sky": "blue", "sea": "blue",
    "grass": "green", "frog": "green",
    "sun": "yellow", "lemon": "yellow",
}
TEST_STORIES = range(6)
DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "object_colours.jsonl")


def context(story: int, obj: str) -> str:
    return f"In story {story}, the {obj} was"


def test_items() -> list[dict]:
    return [
        {"context": context(story, obj), "choices": list(COLOURS), "label": COLOURS.index(colour)}
        for story in TEST_STORIES
        for obj, colour in OBJECT_COLOURS.items()
    ]


def training_text(stories: range = range(100, 164)) -> list[str]:
    """One line per (story, object), for story numbers that the test items do not use."""
    return [f"{context(story, obj)} {colour}." for story in stories for obj, colour in OBJECT_COLOURS.items()]


def write_test_items(path: str = DATA_FILE) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for item in test_items():
            f.write(json.dumps(item) + "\n")


def load_dataset(**_metadata):
    """The task's ``custom_dataset``: the jsonl beside this file, in memory (no hub, no cache)."""
    import datasets

    with open(DATA_FILE, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
