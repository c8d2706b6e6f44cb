"""Exact line deduplication: lines repeated across many documents (headers, footers, boilerplate) are cut.

A line is a ``"\\n"``-separated piece of a document's text; its key is the xxh3-64 hash of the
piece with surrounding whitespace stripped. Lines shorter than ``min_chars`` (after stripping) are
never keys, so short common lines ("The end.") are left alone. A line repeated within one document
counts once for that document.

Pass 1 gives each document one keyed entry per distinct line and groups them by line hash
(:mod:`~marin.curation.dedup.keyed`: sorted runs on scratch, merged per key partition), so a
reducer sees one line's documents; a line found in at least ``min_documents`` documents is
boilerplate, and every document but the first (smallest id), or every document, gets a
:class:`Decision` to remove it. Pass 2 joins those decisions onto the documents per input file
(:class:`AnnotateLines`) and cuts the lines from the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
from zephyr.worker_context import count

from marin.curation.dedup.keyed import KeyBatch, Member, keyed_groups
from marin.curation.dedup.records import (
    Decision,
    Doc,
    FileDocs,
    considered,
    written,
)
from marin.curation.dedup.spill import SpillSettings


def line_decisions(sources: Sequence[FileDocs], min_documents: int, min_chars: int, keep_first: bool,
                   folder: str, backend: Any, partitions: int, settings: SpillSettings) -> tuple[Any, dict[str, int]]:
    """One ``Decision(file, position, {"line": hash})`` per boilerplate line occurrence to cut."""
    return keyed_groups(sources, LineKeys(min_chars), LineDecisions(min_documents, keep_first), folder, backend,
                        partitions, settings, min_size=min_documents)


def line_key(line: str, min_chars: int) -> int | None:
    """The line's hash, or None when the stripped line is shorter than ``min_chars`` (or empty)."""
    stripped = line.strip()
    if not stripped or len(stripped) < min_chars:
        return None
    return xxhash.xxh3_64_intdigest(stripped.encode("utf-8"))


@dataclass(frozen=True)
class LineKeys:
    """Keys of a batch: one per distinct line of each document."""

    min_chars: int
    num_perm: int = 0

    def open(self) -> LineKeys:
        return self

    def __call__(self, docs: list[Doc]) -> KeyBatch:
        keys: list[int] = []
        owners: list[int] = []
        for index, doc in enumerate(docs):
            found = {line_key(line, self.min_chars) for line in doc.text.split("\n")}
            found.discard(None)
            keys.extend(found)
            owners.extend([index] * len(found))
        key = np.array(keys, dtype=np.uint64)
        return KeyBatch(key, np.zeros_like(key), np.array(owners, dtype=np.int64))


@dataclass(frozen=True)
class LineDecisions:
    """Reducer over one line hash: removal decisions for the documents that lose the line."""

    min_documents: int
    keep_first: bool

    def __call__(self, key: int, key2: int, members: list[Member]) -> list[Decision]:
        members = sorted({(m.id, m.file, m.position) for m in members})
        if len(members) < self.min_documents:
            return []
        count("lines/boilerplate")
        losers = members[1:] if self.keep_first else members
        return [Decision(file, position, {"line": key}) for _, file, position in losers]


@dataclass(frozen=True)
class AnnotateLines:
    """Join function: a document written with its removed lines cut from ``text_field``.

    Every document gets ``lines_removed`` (0 when none were); a document with nothing but whitespace
    left is ``kept: false`` with ``reason: "all-lines-duplicated"``.
    """

    text_field: str
    min_chars: int

    def __call__(self, doc: Doc, decided: list[dict]) -> tuple[dict, tuple, int]:
        record = dict(doc.record)
        if considered(doc):
            text, n = cut_lines(doc.text, {attributes["line"] for attributes in decided}, self.min_chars)
            record.setdefault("id", doc.id)
            record[self.text_field] = text
            record.update({"kept": True, "reason": None, "lines_removed": n})
            if n:
                count("lines/removed", n)
                count("lines/documents_changed")
                if not text.strip():
                    record.update({"kept": False, "reason": "all-lines-duplicated"})
        return written(doc, record)


def cut_lines(text: str, keys: set[int], min_chars: int) -> tuple[str, int]:
    """``text`` without the lines whose key is in ``keys``, and how many lines were cut."""
    if not keys:
        return text, 0
    lines = text.split("\n")
    kept = [line for line in lines if line_key(line, min_chars) not in keys]
    return "\n".join(kept), len(lines) - len(kept)
