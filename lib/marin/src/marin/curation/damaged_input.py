"""Damaged input files: never lost in silence.

An input file that cannot be read to its end (a truncated ``.gz``, a WARC cut inside a record, a
jsonl whose last line stops mid-record, random bytes) makes a curation step fail by default, with
one line naming the file, what is wrong and how far it was read. With ``on_damaged_input="skip"``
the step goes on: the documents read before the damage are kept, the rest of the file is left out,
and the step's summary counts the damaged files and what was lost (``summary["damaged"]``).

Damage travels from the reader to the shard's counts as a :class:`DamagedFile` item in the record
stream, so the counts are written with the shard (``stats/``) and survive a rerun that skips it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from zephyr.errors import InputFileError

from marin.errors import MarinError

logger = logging.getLogger(__name__)

OnDamagedInput = Literal["fail", "skip"]


class DamagedInputError(MarinError, ValueError):
    """An input file that cannot be read to its end; says which, what is wrong and how far it was read."""

    def __init__(self, path: str, problem: str, bytes_read: int | None = None, bytes_total: int | None = None,
                 documents_read: int | None = None, remedy: str | None = None):
        self.path, self.problem, self.remedy = path, problem, remedy
        self.bytes_read, self.bytes_total, self.documents_read = bytes_read, bytes_total, documents_read
        super().__init__(self._message())

    def _message(self) -> str:
        read = []
        if self.documents_read is not None:
            read.append(f"{self.documents_read:,} document{'' if self.documents_read == 1 else 's'}")
        if self.bytes_read is not None:
            total = f" of {self.bytes_total:,}" if self.bytes_total is not None else ""
            read.append(f"{self.bytes_read:,}{total} bytes")
        so_far = f"; read {' and '.join(read)} before the damage" if read else ""
        remedy = self.remedy or ("Replace the file, or pass on_damaged_input='skip' to go on without the rest of it "
                                 "(the summary counts what is lost).")
        return f"{self.path}: damaged input: {self.problem}{so_far}. {remedy}"

    def __reduce__(self):  # keeps the fields when sent back from a worker process
        fields = (self.path, self.problem, self.bytes_read, self.bytes_total, self.documents_read, self.remedy)
        return (type(self), fields)


@dataclass(frozen=True)
class DamagedFile:
    """A file read only in part, as an item of the record stream (see the module docstring)."""

    path: str
    problem: str
    documents_read: int
    bytes_read: int | None = None
    bytes_total: int | None = None


def check_on_damaged_input(value: str) -> None:
    if value not in ("fail", "skip"):
        raise ValueError(f"on_damaged_input must be 'fail' or 'skip', not {value!r}")


def as_damage(error: InputFileError | DamagedInputError, path: str, documents_read: int,
              remedy: str | None = None) -> DamagedInputError:
    """``error`` (a reader's) as a :class:`DamagedInputError` that says how many documents were read."""
    if isinstance(error, DamagedInputError):
        return DamagedInputError(error.path, error.problem, error.bytes_read, error.bytes_total, documents_read, remedy)
    problem = f"line {error.line}: {error.problem}" if error.line is not None else error.problem
    return DamagedInputError(path, problem, documents_read=documents_read, remedy=remedy)


@dataclass(frozen=True)
class GuardedReader:
    """Picklable: ``reader``'s records of one file, with damage failing the step or ending the file.

    Damage is what the readers raise for a file they cannot read to its end: zephyr's
    ``InputFileError`` (jsonl, Parquet, text) and :class:`DamagedInputError` (HTML and WARC).
    """

    reader: Callable[[str], Iterable[dict]]
    on_damaged_input: OnDamagedInput = "fail"

    def __call__(self, path: str) -> Iterator[Any]:
        documents_read = 0
        try:
            for record in self.reader(path):
                yield record
                documents_read += 1
        except (InputFileError, DamagedInputError) as error:
            damage = as_damage(error, path, documents_read)
            if self.on_damaged_input != "skip":
                raise damage from None
            logger.warning("%s: damaged input: %s; keeping the %d documents read before the damage and "
                           "skipping the rest (on_damaged_input='skip')", damage.path, damage.problem, documents_read)
            yield DamagedFile(damage.path, damage.problem, documents_read, damage.bytes_read, damage.bytes_total)


def damage_summary(files: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``summary["damaged"]``: how many files were read only in part, the documents read from them
    before the damage, the bytes left unread where known, and each file."""
    by_file = sorted((dict(entry) for entry in files), key=lambda entry: entry["path"])
    unread = [entry["bytes_total"] - entry["bytes_read"] for entry in by_file
              if entry.get("bytes_total") is not None and entry.get("bytes_read") is not None]
    return {
        "files": len(by_file),
        "documents_read": sum(entry["documents_read"] for entry in by_file),
        "bytes_unread": sum(unread),
        "by_file": by_file,
    }

