"""Exact line deduplication: lines repeated across many documents (headers, footers, boilerplate) are cut.

A line is a ``"\\n"``-separated piece of a document's text; its key is the xxh3-64 hash of the
piece with surrounding whitespace stripped. Lines shorter than ``min_chars`` (after stripping) are
never keys, so short common lines ("The end.") are left alone. A line repeated within one document
counts once for that document.

Pass 1 maps each document to one ``(line hash, id, file, position)`` item per distinct key and
groups them by line hash, so a reducer sees one line's documents; a line found in at least
``min_documents`` documents is boilerplate, and every document but the first (smallest id), or
every document, gets a :class:`Decision` to remove it. Pass 2 joins those decisions onto the
documents per input file (:class:`AnnotateLines`) and cuts the lines from the text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import xxhash
from zephyr import Dataset
from zephyr.worker_context import count

from marin.curation.dedup.records import (
    Decision,
    Doc,
    FileDocs,
    considered,
    written,
)


def line_decisions(sources: Sequence[FileDocs], min_documents: int, min_chars: int, keep_first: bool,
                   num_shards: int) -> Dataset:
    """One ``Decision(file, position, {"line": hash})`` per boilerplate line occurrence to cut."""
    return (Dataset.from_shards(sources).filter(considered).flat_map(LineItems(min_chars))
            .group_by(_line_hash, LineDecisions(min_documents, keep_first), num_shards=num_shards)
            .flat_map(_as_list))


def _line_hash(item: tuple) -> int:
    return item[0]


def _as_list(decisions: list[Decision]) -> list[Decision]:
    return decisions


def line_key(line: str, min_chars: int) -> int | None:
    """The line's hash, or None when the stripped line is shorter than ``min_chars`` (or empty)."""
    stripped = line.strip()
    if not stripped or len(stripped) < min_chars:
        return None
    return xxhash.xxh3_64_intdigest(stripped.encode("utf-8"))


@dataclass(frozen=True)
class LineItems:
    """flat_map function: a document -> one ``(line hash, id, file, position)`` per distinct line."""

    min_chars: int

    def __call__(self, doc: Doc) -> list[tuple]:
        keys = {line_key(line, self.min_chars) for line in doc.text.split("\n")}
        keys.discard(None)
        return [(key, doc.id, doc.file, doc.position) for key in sorted(keys)]


@dataclass(frozen=True)
class LineDecisions:
    """group_by reducer over one line hash: removal decisions for the documents that lose the line."""

    min_documents: int
    keep_first: bool

    def __call__(self, key: int, members: Iterator[tuple]) -> list[Decision]:
        members = sorted(set(members), key=lambda m: (m[1], m[2], m[3]))
        if len(members) < self.min_documents:
            return []
        count("lines/boilerplate")
        losers = members[1:] if self.keep_first else members
        return [Decision(file, position, {"line": key}) for _, _, file, position in losers]


@dataclass(frozen=True)
class AnnotateLines:
    """Per-file join reducer: each document written with its removed lines cut from ``text_field``.

    Every document gets ``lines_removed`` (0 when none were); a document with nothing but whitespace
    left is ``kept: false`` with ``reason: "all-lines-duplicated"``.
    """

    text_field: str
    min_chars: int

    def __call__(self, file: int, items: Iterator[Doc | Decision]) -> list[tuple[dict, tuple, int]]:
        docs: list[Doc] = []
        removed: dict[int, set[int]] = {}
        for item in items:
            if isinstance(item, Doc):
                docs.append(item)
            else:
                removed.setdefault(item.position, set()).add(item.attributes["line"])
        docs.sort(key=lambda d: d.position)
        out = []
        for doc in docs:
            record = dict(doc.record)
            text = doc.text
            if considered(doc):
                text, n = cut_lines(doc.text, removed.get(doc.position, set()), self.min_chars)
                record.setdefault("id", doc.id)
                record[self.text_field] = text
                record.update({"kept": True, "reason": None, "lines_removed": n})
                if n:
                    count("lines/removed", n)
                    count("lines/documents_changed")
                    if not text.strip():
                        record.update({"kept": False, "reason": "all-lines-duplicated"})
            out.append(written(doc, record))
        return out


def cut_lines(text: str, keys: set[int], min_chars: int) -> tuple[str, int]:
    """``text`` without the lines whose key is in ``keys``, and how many lines were cut."""
    if not keys:
        return text, 0
    lines = text.split("\n")
    kept = [line for line in lines if line_key(line, min_chars) not in keys]
    return "\n".join(kept), len(lines) - len(kept)
