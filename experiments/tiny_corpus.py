"""A raw, messy corpus for the curation tutorial, built offline and deterministically.

What a crawl brings, in miniature: web pages with navigation and footers around the text, stories
(from the project's story generator) with exact and near copies, documents in other languages,
spam, and documents that contain evaluation items word for word. Each planted kind is counted in
:data:`PLANTED`, so what the curation chain removes can be checked against it.
"""

from __future__ import annotations

import json
import random

from storygen import generate_stories

STORIES = 400
PLANTED = {"exact_copies": 20, "near_copies": 20, "other_language": 6, "spam": 10, "leaks": 5, "pages": 12}

OTHER_LANGUAGE = (
    "Il était une fois un petit chat qui aimait jouer dans le jardin avec ses amis. Chaque matin, il regardait "
    "les oiseaux et rêvait de voler très haut dans le ciel.",
    "Es war einmal ein kleiner Hund, der jeden Tag im Park spielte. Er lief über die Wiese und suchte seinen "
    "roten Ball unter den großen Bäumen.",
    "Había una vez una niña que vivía cerca del mar. Todas las tardes caminaba por la playa y buscaba conchas "
    "de colores para su abuela.",
)
EVAL_ITEMS = tuple(
    f"the little {animal} found a shiny {thing} under the old bridge and carried it home before the rain started"
    for animal, thing in (("fox", "key"), ("rabbit", "coin"), ("owl", "ring"), ("mouse", "button"), ("duck", "bell"))
)


def _near_copy(text: str, rng: random.Random) -> str:
    """The text with about one word in a hundred changed: a clear near duplicate (Jaccard of 5-grams ~0.9).

    Clear so that the chain removes exactly what was planted: at the default bands (18 of 7 rows) a
    pair at Jaccard 0.9 misses every bucket with probability ~1e-5, one at 0.82 with ~0.006.
    """
    words = text.split()
    for index in rng.sample(range(len(words)), max(1, len(words) // 100)):
        words[index] = rng.choice(("little", "happy", "big", "small", "kind"))
    return " ".join(words)


def documents(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    stories = generate_stories(STORIES, seed=seed)
    docs = [{"id": f"story-{i}", "text": text} for i, text in enumerate(stories)]
    docs += [{"id": f"copy-{i}", "text": stories[i]} for i in range(PLANTED["exact_copies"])]
    docs += [{"id": f"near-{i}", "text": _near_copy(stories[100 + i], rng)} for i in range(PLANTED["near_copies"])]
    docs += [{"id": f"lang-{i}", "text": OTHER_LANGUAGE[i % len(OTHER_LANGUAGE)] + f" ({i})"}
             for i in range(PLANTED["other_language"])]
    docs += [{"id": f"spam-{i}", "text": f"buy now click here best price offer {i} " * 15} for i in range(PLANTED["spam"])]
    docs += [{"id": f"leak-{i}", "text": stories[200 + i] + " " + EVAL_ITEMS[i].capitalize() + "."}
             for i in range(PLANTED["leaks"])]
    rng.shuffle(docs)
    return docs


def pages(seed: int = 0) -> list[tuple[str, str]]:
    """``(file name, HTML)`` of web pages: a story inside navigation, a sidebar and a footer."""
    stories = generate_stories(PLANTED["pages"], seed=seed + 1)
    return [(f"page-{i:02d}.html",
             f"<html lang=en><head><title>Story {i}</title></head><body><nav>Home | Stories | About | Contact</nav>"
             f"<aside>Subscribe to our newsletter!</aside><article>"
             + "".join(f"<p>{paragraph}</p>" for paragraph in story.split("\n") if paragraph.strip())
             + "</article><footer>Copyright 2026 Tiny Tales. All rights reserved.</footer></body></html>")
            for i, story in enumerate(stories)]


def as_jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)
