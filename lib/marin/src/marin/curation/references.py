"""What a decontamination step compares against: sets of reference texts, each with an identity.

A :class:`References` is one set as the step sees it when declared: its identity (hashed with the
step, so other references never reuse a cached result), the steps it depends on, and the
``(item id, text)`` pairs it yields when the step runs. Three kinds exist: evaluation files (this
module), the project's built-in evaluation tasks (:mod:`marin.curation.reference_tasks`) and token
caches decoded with their tokenizer (:mod:`marin.curation.reference_caches`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from marin.curation.steps import read_records, resolve_input
from marin.execution.lazy import LazyStep

Items = Iterable[tuple[str, str]]


@dataclass(frozen=True)
class References:
    """One set of reference texts: ``items_at_run_time(ctx)`` yields ``(item id, text)`` pairs.

    An item may yield several texts under one id (a multiple-choice question with each answer).
    ``must_match``: a set none of whose items is long enough to match on (``min_words``) is
    refused rather than silently checking nothing; evaluation files keep their old behaviour.
    """

    label: str
    identity: Any
    items_at_run_time: Callable[[Any], Items]
    deps: tuple[LazyStep, ...] = ()
    must_match: bool = True


def evaluation_items(files: Sequence[str], text_fields: Sequence[str]) -> Iterator[tuple[str, str]]:
    """``(id, text)`` per evaluation record: ``<file name>:<record number>``, the fields joined."""
    for path in files:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        for number, record in enumerate(read_records([path], text_fields[0]), 1):
            text = "\n".join(str(record[f]) for f in text_fields if record.get(f) is not None)
            yield f"{name}:{number}", text


def file_references(eval_sets: Any, text_fields: Sequence[str]) -> References:
    """Text, jsonl or parquet files (a file, folder, glob, URL, a list) or a step listing its files."""
    resolved = resolve_input(eval_sets)
    fields = tuple(text_fields)
    return References(
        label="evaluation files",
        identity=resolved.identity,
        items_at_run_time=lambda ctx: evaluation_items(resolved.files_at_run_time(ctx), fields),
        deps=resolved.deps,
        must_match=False,
    )
