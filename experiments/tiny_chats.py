"""A small offline chat set for the fine-tuning tutorial: questions about a little world, with answers.

The world is fixed (each toy has one colour, each animal one sound, each child one pet), so the
answers are facts a tiny model can learn in a few hundred steps, and a held-back question can be
checked by eye. Conversations are deterministic in ``(count, seed)`` and use the words of the
built-in story corpus, which the tutorial's tokenizer was trained on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

TOY_COLOURS = {"ball": "red", "kite": "blue", "boat": "green", "drum": "yellow", "hat": "purple", "car": "orange"}
ANIMAL_SOUNDS = {"dog": "woof", "cat": "meow", "cow": "moo", "duck": "quack", "sheep": "baa", "bird": "tweet"}
CHILD_PETS = {"Lily": "dog", "Tom": "cat", "Mia": "duck", "Ben": "cow", "Sara": "bird", "Max": "sheep"}


def _question_and_answer(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(4)
    if kind == 0:
        toy = rng.choice(sorted(TOY_COLOURS))
        return f"What colour is the {toy}?", f"The {toy} is {TOY_COLOURS[toy]}."
    if kind == 1:
        animal = rng.choice(sorted(ANIMAL_SOUNDS))
        return f"What does the {animal} say?", f"The {animal} says {ANIMAL_SOUNDS[animal]}."
    if kind == 2:
        child = rng.choice(sorted(CHILD_PETS))
        return f"What pet does {child} have?", f"{child} has a {CHILD_PETS[child]}."
    child = rng.choice(sorted(CHILD_PETS))
    pet = CHILD_PETS[child]
    return f"What does {child}'s pet say?", f"{child} has a {pet}. The {pet} says {ANIMAL_SOUNDS[pet]}."


def conversations(count: int, seed: int = 0) -> Iterator[dict]:
    """``count`` records ``{"messages": [...]}``: one question and its answer each, some with a
    second question in the same conversation."""
    rng = random.Random(seed)
    for _ in range(count):
        messages = []
        for _ in range(1 + (rng.random() < 0.3)):
            question, answer = _question_and_answer(rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        yield {"messages": messages}


def as_jsonl(count: int, seed: int = 0) -> str:
    """``conversations(count, seed)`` as the text of a jsonl file."""
    return "".join(json.dumps(record) + "\n" for record in conversations(count, seed))
