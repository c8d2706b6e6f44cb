"""WARC files record by record, with damage refused rather than read as a shorter file.

warcio reads what it can: a ``.warc.gz`` cut short ends early without a word (its decompressor
stops at the end of the data), and a record whose block is shorter than its ``Content-Length`` is
returned as if whole. Here the gzip layer is read by Python's ``gzip`` module, which checks every
member's end marker, CRC and length, and each record's block is read to its end and compared with
its ``Content-Length``; a record without a ``Content-Length`` (a header cut short: warcio would read
it to the end of the file) and anything after the last record that is not a whole record are
damage too. Each raises :class:`~marin.curation.damaged_input.DamagedInputError` naming the file
and how far it was read, and nothing of a record is given before the whole of it has been checked.

A file cut exactly between two records (or gzip members) is a valid, shorter WARC: no reader can
tell it from one written that way.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any

from rigging import filesystem as fsx

from marin.curation.damaged_input import DamagedInputError
from marin.errors import MarinError

_GZIP_MAGIC = b"\x1f\x8b"


class _Broken(MarinError):
    """Damage found while reading records; turned into a DamagedInputError naming the file."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


class _CountingReader(io.RawIOBase):
    """The file's bytes, counting how many were read (how far the file was read when damage is found)."""

    def __init__(self, handle: IO[bytes]):
        self._handle, self.count = handle, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._handle.read(len(buffer))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)


class _CheckedGzip(io.RawIOBase):
    """Decompressed bytes of a (multi-member) gzip stream.

    Damage ends the stream and is kept in ``problem`` rather than raised: readers ahead of the
    damage buffer past it, and raising there would lose the whole records read before it.
    """

    def __init__(self, raw: IO[bytes]):
        self._stream = gzip.GzipFile(fileobj=raw, mode="rb")
        self.problem: str | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.problem is not None:
            return 0
        try:
            data = self._stream.read1(len(buffer))  # one read at a time: a failing one loses nothing before it
        except EOFError:
            self.problem = "the gzip data ends early (the file was cut short?)"
            return 0
        except (gzip.BadGzipFile, zlib.error) as error:
            self.problem = f"corrupt gzip data ({error})"
            return 0
        buffer[: len(data)] = data
        return len(data)


def _drain(stream: Any) -> None:
    while stream.read(1 << 16):
        pass


def _short_by(record: Any) -> int:
    """How many bytes of the record's ``Content-Length`` its block lacks, once read to its end."""
    _drain(record.raw_stream)
    return max(0, int(getattr(record.raw_stream, "limit", 0) or 0))


def warc_records(path: str, wanted: Callable[[Any], bool]) -> Iterator[tuple[Any, bytes]]:
    """``(record, content)`` for each record of a WARC file (``.warc`` or ``.warc.gz``) that ``wanted``
    accepts; every record, wanted or not, is read to its end and checked whole before it is given.
    """
    from warcio.archiveiterator import ArchiveIterator

    fs, stripped = fsx.filesystem(path)
    total = fs.size(stripped)
    with fsx.open_url(path, "rb") as handle:
        counted = _CountingReader(handle)
        buffered = io.BufferedReader(counted)
        stream: IO[bytes] = buffered
        gzipped = None
        if buffered.peek(2)[:2] == _GZIP_MAGIC:
            gzipped = _CheckedGzip(buffered)
            stream = io.BufferedReader(gzipped)
        is_warc = stream.peek(5)[:5] == b"WARC/"
        records = ArchiveIterator(stream)
        number = 0
        try:
            for record in _parsed(records, lambda: _unreadable(number, is_warc)):
                number += 1
                if not str(record.rec_headers.get_header("Content-Length") or "").strip().isdigit():
                    # warcio reads such a record to the end of the file: a header cut short looks whole
                    raise _Broken(f"record {number} has no Content-Length (its header is cut short?)")
                content = record.content_stream().read() if wanted(record) else None
                missing = _short_by(record)
                if missing:
                    raise _Broken(f"the file ends inside a record (record {number} lacks {missing:,} of its "
                                  f"{int(record.length):,} bytes)")
                if content is not None:
                    yield record, content
            if gzipped is not None and gzipped.problem:
                raise _Broken(f"{gzipped.problem}, after record {number}")
            # warcio ends quietly when what follows the last record is not a whole record
            if records.offset < records.fh.tell():
                raise _Broken(_unreadable(number, is_warc))
        except _Broken as error:
            if gzipped is not None and gzipped.problem and "gzip" not in error.problem:
                error = _Broken(f"{gzipped.problem}, after record {number}")
            raise DamagedInputError(path, error.problem, counted.count, total) from None


def _unreadable(number: int, is_warc: bool) -> str:
    if not is_warc:
        return "not a WARC file (it does not start with 'WARC/')"
    return f"the file ends inside a record (record {number + 1} is not whole)"


def _parsed(records: Any, problem: Callable[[], str]) -> Iterator[Any]:
    """warcio's records, with its parse errors (some of them a bare AttributeError on a header cut
    short) as :class:`_Broken`."""
    from warcio.exceptions import ArchiveLoadFailed
    from warcio.statusandheaders import StatusAndHeadersParserException

    iterator = iter(records)
    while True:
        try:
            record = next(iterator)
        except StopIteration:
            return
        except (ArchiveLoadFailed, StatusAndHeadersParserException, AttributeError, ValueError, IndexError):
            raise _Broken(problem()) from None
        yield record
