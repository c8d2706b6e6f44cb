"""Documents as the dedup steps see them, and how decisions are joined back onto them.

A document is a :class:`Doc`: where it comes from (input file index and line/row), its id (the
record's id field, else ``<file>#<line>``), its text and the whole record. Decisions are computed
on small keyed items and joined back per input file (:mod:`~marin.curation.dedup.join`), so every
input document comes out exactly once, in input order, with its ``kept``/``reason``/``cluster``
attributes, as the ``(record, hits, bytes in)`` items that :func:`marin.curation.steps.write_curated` writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from zephyr.errors import InputFileError
from zephyr.readers import input_format, read_jsonl, read_parquet

from marin.curation.damaged_input import as_damage
from marin.errors import MarinError


class DedupInputError(MarinError, ValueError):
    """An input record has no text to compare."""


@dataclass(frozen=True)
class Doc:
    file: int
    position: int
    id: str
    text: str
    record: dict


@dataclass(frozen=True)
class Decision:
    """What a dedup pass says about one document; documents without one are kept as they are."""

    file: int
    position: int
    attributes: dict


def relative_names(files: Sequence[str]) -> list[str]:
    """File names relative to the files' common folder: ids then do not depend on where the data lives."""
    if len(files) == 1:
        return [files[0].rstrip("/").rsplit("/", 1)[-1]]
    common = os.path.commonpath([f.split("://", 1)[-1] for f in files])
    return [f.split("://", 1)[-1][len(common):].lstrip("/") for f in files]


@dataclass(frozen=True)
class FileDocs:
    """One input file's documents (a picklable zero-argument shard source)."""

    url: str
    file: int
    name: str
    text_field: str
    id_field: str

    def __call__(self) -> Iterator[Doc]:
        kind, _ = input_format(self.url)
        records: Iterable[Any] = read_parquet(self.url) if kind == "parquet" else _jsonl_allowing_empty(self.url)
        read = 0
        try:
            for position, record in enumerate(records):
                text = record.get(self.text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise DedupInputError(
                        f"{self.url}, record {position}: no string field {self.text_field!r}; set text_field=")
                identifier = record.get(self.id_field)
                identifier = f"{self.name}#{position}" if identifier is None else str(identifier)
                yield Doc(self.file, position, identifier, text, record)
                read += 1
        except InputFileError as error:
            # Dedup reads each file in several passes and joins what they decide by position, so it
            # takes only whole files; a curation step before it can skip the damaged ones.
            raise as_damage(error, self.url, read, _DEDUP_REMEDY) from None


_DEDUP_REMEDY = ("Replace the file, or read it first with a curation step given on_damaged_input='skip' "
                 "(deduplication reads only whole files).")


def _jsonl_allowing_empty(url: str) -> Iterator[Any]:
    """An empty jsonl file is a shard with no documents (earlier dedup outputs can have some), not an error."""
    try:
        yield from read_jsonl(url)
    except InputFileError as error:
        if "is empty" not in str(error):
            raise


def file_sources(files: Sequence[str], text_field: str, id_field: str) -> list[FileDocs]:
    return [FileDocs(url, index, name, text_field, id_field)
            for index, (url, name) in enumerate(zip(files, relative_names(files)))]


def considered(doc: Doc) -> bool:
    """Documents an earlier pass already removed travel through untouched and are not compared again."""
    return doc.record.get("kept", True) is not False


def annotate_document(doc: Doc, decided: list[dict]) -> tuple[dict, tuple, int]:
    """The default join: the document's decisions' attributes merged onto it, in the order they came."""
    record = dict(doc.record)
    if considered(doc):
        record.setdefault("id", doc.id)
        record.update({"kept": True, "reason": None, "cluster": doc.id})
        for attributes in decided:
            record.update(attributes)
    return written(doc, record)


def written(doc: Doc, record: dict) -> tuple[dict, tuple, int]:
    """The item the writer takes for ``doc`` annotated as ``record``: no hits, the input's bytes."""
    return record, (), len(doc.text.encode("utf-8"))
