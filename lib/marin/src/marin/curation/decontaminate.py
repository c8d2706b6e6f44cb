"""Decontamination: training documents that share an n-gram with an evaluation item are removed (or marked).

Words are normalised (Unicode casefold, letters and digits only), so punctuation, case and
spacing cannot hide a leak. Each evaluation item contributes its word n-grams (13 by default, as
GPT-3 did); an item shorter than ``n`` words contributes itself whole if it has at least
``min_words``. A document is contaminated when any of its n-grams is an evaluation n-gram; its
``contamination`` attribute names the evaluation items it matched, and the step's summary counts,
per evaluation item, how many documents hit it.

The items come from three kinds of reference (:mod:`marin.curation.references`): evaluation files
(``<file name>:<record number>``), the project's built-in evaluation tasks by name
(``<task>:<document index>``) and token caches decoded with their tokenizer
(``<cache>:<document index>``). Each is part of the step's identity.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marin.curation.reference_caches import cache_references
from marin.curation.reference_tasks import task_references
from marin.curation.references import References, file_references
from marin.curation.steps import CurationError, StepOptions, Verdict, curation_step
from marin.execution.lazy import LazyStep

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

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


class ReferenceIndex:
    """n-gram key -> the evaluation items (ids) that contain it, built one reference set at a time."""

    def __init__(self, config: DecontaminationConfig):
        self.config = config
        self.owners: dict[bytes, list[str]] = {}
        self.short_lengths: set[int] = set()  # word counts of the items indexed whole

    def add(self, item_id: str, text: str) -> tuple[int, bool]:
        """Index one text of ``item_id``: its word count, and whether it was long enough to index."""
        words = normalized_words(text)
        if len(words) >= self.config.n:
            keys = set(ngram_keys(words, self.config.n))
        elif len(words) >= self.config.min_words:
            keys = {_gram_key(words)}
            self.short_lengths.add(len(words))
        else:
            return len(words), False
        for key in keys:
            owners = self.owners.setdefault(key, [])
            if not owners or owners[-1] != item_id:
                owners.append(item_id)
        return len(words), True

    def add_references(self, references: References, ctx: Any) -> None:
        """Index every item of ``references``; refuse a set that must match but has nothing to match on."""
        items = indexed = longest = 0
        last = last_indexed = None  # an item's texts come one after another
        for item_id, text in references.items_at_run_time(ctx):
            if item_id != last:
                items, last = items + 1, item_id
            words, added = self.add(item_id, text)
            longest = max(longest, words)
            if added and item_id != last_indexed:
                indexed, last_indexed = indexed + 1, item_id
        logger.info("decontamination: %s: %d items, %d long enough to match on", references.label, items, indexed)
        if references.must_match and not indexed:
            raise CurationError(
                f"{references.label}: none of its {items} items has min_words={self.config.min_words} words (the longest "
                f"has {longest}); lower min_words to match its items whole" if items else f"{references.label} holds no text"
            )

    def check(self, text_field: str) -> ContaminationCheck:
        index = {key: tuple(owners) for key, owners in self.owners.items()}
        return ContaminationCheck(index, self.config, tuple(sorted(self.short_lengths)), text_field)


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


def decontaminated(
    name: str,
    source: Any,
    eval_sets: Any = None,
    *,
    eval_tasks: Sequence[str] = (),
    eval_caches: Sequence[Any] = (),
    n: int = 13,
    min_words: int = 8,
    eval_text_fields: Sequence[str] = ("text",),
    **options: Unpack[StepOptions],
) -> LazyStep:
    """A lazy step removing (``mode="remove"``) or marking (``"mark"``) documents that overlap the references.

    ``eval_sets``: text/jsonl/parquet files (a file, folder, glob, URL, a list) or a step whose result
    lists its files; ``eval_text_fields``: the fields of an evaluation record whose text counts
    (for example ``("question", "answer")``); the first must be present in every record.
    ``eval_tasks``: names of the project's built-in evaluation tasks (``marin.evaluation.tasks``).
    ``eval_caches``: token caches, each a tokenize step's handle, a cache folder (or a folder of
    them) whose tokenizer its records name, or a ``(folder, tokenizer)`` pair.
    """
    if n < 1 or min_words < 1:
        raise CurationError(f"n and min_words must be positive, got n={n}, min_words={min_words}")
    config = DecontaminationConfig(n, min_words)
    files = None if eval_sets is None else file_references(eval_sets, eval_text_fields)
    tasks = task_references(eval_tasks)
    caches = cache_references(eval_caches)
    references = ([files] if files else []) + tasks + caches
    if not references:
        raise CurationError("decontamination needs references to compare against: give eval_sets, eval_tasks or eval_caches")
    text_field = options.get("text_field", "text")

    def make_annotator(ctx) -> ContaminationCheck:
        index = ReferenceIndex(config)
        for reference in references:
            index.add_references(reference, ctx)
        return index.check(text_field)

    # Only the kinds given are hashed, so a step made before tasks and caches existed keeps its identity.
    identity: dict[str, Any] = {"config": config}
    if files:
        identity.update(eval_sets=files.identity, eval_text_fields=tuple(eval_text_fields))
    if tasks:
        identity["eval_tasks"] = [reference.identity for reference in tasks]
    if caches:
        identity["eval_caches"] = [reference.identity for reference in caches]
    deps = tuple(dep for reference in references for dep in reference.deps)
    return curation_step(name, "decontaminate", source, identity, make_annotator, extra_deps=deps, **options)
