"""Decontamination: training documents that share an n-gram with an evaluation item are removed (or marked).

Words are normalised (Unicode casefold, letters and digits only), so punctuation, case and
spacing cannot hide a leak. Each evaluation item contributes its word n-grams (13 by default, as
GPT-3 did); an item shorter than ``n`` words contributes itself whole if it has at least
``min_words``. A document is contaminated when any of its n-grams is an evaluation n-gram; its
``contamination`` attribute names the evaluation items it matched (``<file name>:<line>``), and the
step's summary counts, per evaluation item, how many documents hit it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.curation.steps import (
    CurationError,
    StepOptions,
    Verdict,
    curation_step,
    read_records,
    resolve_input,
)
from marin.execution.lazy import LazyStep

if TYPE_CHECKING:
    from typing_extensions import Unpack

_TOKEN = re.compile(r"[^\W_]+")


def normalized_words(text: str) -> list[str]:
    """The words of ``text``, casefolded, without punctuation."""
    return _TOKEN.findall(text.casefold())


def _gram_key(words: Sequence[str]) -> bytes:
    return hashlib.blake2b(" ".join(words).encode("utf-8"), digest_size=8).digest()


def ngram_keys(words: Sequence[str], n: int) -> Iterable[bytes]:
    for i in range(len(words) - n + 1):
        yield _gram_key(words[i : i + n])


@dataclass(frozen=True)
class DecontaminationConfig:
    n: int = 13
    min_words: int = 8  # shorter evaluation items are too generic to match on


def build_index(items: Iterable[tuple[str, str]], config: DecontaminationConfig) -> dict[bytes, tuple[str, ...]]:
    """n-gram key -> the evaluation items (ids) that contain it, from ``(item id, text)`` pairs."""
    index: dict[bytes, list[str]] = {}
    for item_id, text in items:
        words = normalized_words(text)
        if len(words) >= config.n:
            keys = set(ngram_keys(words, config.n))
        elif len(words) >= config.min_words:
            keys = {_gram_key(words)}
        else:
            continue
        for key in keys:
            owners = index.setdefault(key, [])
            if not owners or owners[-1] != item_id:
                owners.append(item_id)
    return {key: tuple(owners) for key, owners in index.items()}


@dataclass(frozen=True)
class ContaminationCheck:
    """Picklable annotator: a document's evaluation-item hits."""

    index: dict[bytes, tuple[str, ...]]
    config: DecontaminationConfig
    short_lengths: tuple[int, ...]  # word counts of the evaluation items indexed whole
    text_field: str = "text"

    def __call__(self, record: dict) -> Verdict:
        words = normalized_words(record[self.text_field])
        hits: set[str] = set()
        for n in (self.config.n, *self.short_lengths):
            for key in ngram_keys(words, n):
                hits.update(self.index.get(key, ()))
        found = tuple(sorted(hits))
        if found:
            return Verdict(False, "decontaminate", None, {"contamination": list(found)}, found)
        return Verdict(True, attributes={"contamination": []})


def evaluation_items(files: Sequence[str], text_fields: Sequence[str]) -> Iterable[tuple[str, str]]:
    """``(id, text)`` per evaluation record: ``<file name>:<record number>``, the fields joined."""
    for path in files:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        for number, record in enumerate(read_records([path], text_fields[0]), 1):
            text = "\n".join(str(record[f]) for f in text_fields if record.get(f) is not None)
            yield f"{name}:{number}", text


def decontaminated(
    name: str,
    source: Any,
    eval_sets: Any,
    *,
    n: int = 13,
    min_words: int = 8,
    eval_text_fields: Sequence[str] = ("text",),
    **options: Unpack[StepOptions],
) -> LazyStep:
    """A lazy step removing (``mode="remove"``) or marking (``"mark"``) documents that overlap ``eval_sets``.

    ``eval_sets``: text/jsonl/parquet files (a file, folder, glob, URL, a list) or a step whose result
    lists its files; ``eval_text_fields``: the fields of an evaluation record whose text counts
    (for example ``("question", "answer")``); the first must be present in every record.
    """
    if n < 1 or min_words < 1:
        raise CurationError(f"n and min_words must be positive, got n={n}, min_words={min_words}")
    config = DecontaminationConfig(n, min_words)
    evals = resolve_input(eval_sets)
    fields = tuple(eval_text_fields)
    text_field = options.get("text_field", "text")

    def make_annotator(ctx) -> ContaminationCheck:
        items = list(evaluation_items(evals.files_at_run_time(ctx), fields))
        index = build_index(items, config)
        short = sorted({len(w) for w in (normalized_words(t) for _, t in items) if config.min_words <= len(w) < config.n})
        return ContaminationCheck(index, config, tuple(short), text_field)

    return curation_step(
        name, "decontaminate", source, {"config": config, "eval_sets": evals.identity, "eval_text_fields": fields},
        make_annotator, extra_deps=evals.deps, **options,
    )
