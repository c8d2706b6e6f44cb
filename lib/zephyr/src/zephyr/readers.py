"""Readers: documents from jsonl (plain/.gz/.zst), parquet, plain text, folders and globs of
those, and Hugging Face dataset ids.

Bad input raises :class:`InputFileError` naming the file (and the line, for jsonl), or, with
``on_error="skip"``, is skipped and counted in the running task's ``WorkerContext`` counters
(``skipped/<reason>``). A path that does not exist always raises: skipping it would turn a typo
into a silently empty dataset.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal

from zephyr._fs import exists, url_to_fs
from zephyr.dataset import Dataset, expand_glob
from zephyr.errors import (
    HubDatasetUnavailableError,
    InputError,
    InputFileError,
    InputNotFoundError,
    UnsupportedInputError,
)
from zephyr.output_checksums import check_recorded_checksum
from zephyr.worker_context import count
from zephyr.zstd_frames import ZstdFrames

logger = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]

_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_TEXT_SUFFIXES = (".txt", ".text")
_PARQUET_SUFFIXES = (".parquet",)
_COMPRESSIONS = (".gz", ".zst")


def input_format(path: str) -> tuple[str, str]:
    """``(format, compression)`` from the file name: format is jsonl, parquet or text."""
    name = os.path.basename(path).lower()
    compression = next((suffix for suffix in _COMPRESSIONS if name.endswith(suffix)), "")
    stem = name[: len(name) - len(compression)]
    if stem.endswith(_JSONL_SUFFIXES):
        return "jsonl", compression
    if stem.endswith(_TEXT_SUFFIXES):
        return "text", compression
    if stem.endswith(_PARQUET_SUFFIXES) and not compression:
        return "parquet", ""
    raise UnsupportedInputError(
        f"{path}: cannot tell the format from the name; zephyr reads *.jsonl/*.json/*.ndjson, *.txt/*.text "
        "(each optionally .gz or .zst) and *.parquet"
    )


def _is_supported(path: str) -> bool:
    try:
        input_format(path)
    except UnsupportedInputError:
        return False
    return True


def expand_input_files(spec: str | Sequence[str]) -> list[str]:
    """Every readable file named by ``spec``: a file, a folder (recursively), a glob, or a list of those."""
    return expand_glob(spec, folder_filter=_is_supported, wanted="jsonl, parquet or text files")


@contextlib.contextmanager
def _open_binary(path: str, compression: str) -> Iterator[IO[bytes]]:
    """The decompressed bytes of ``path``; closes the underlying file too."""
    fs, fs_path = url_to_fs(path)
    try:
        raw = fs.open(fs_path, "rb")
    except FileNotFoundError:
        raise InputNotFoundError(f"input path {path!r} does not exist") from None
    with raw:
        check_recorded_checksum(path, raw)  # a step's output, changed since it was committed, is never read
        if compression == ".gz":
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                yield stream
        elif compression == ".zst":
            with io.BufferedReader(ZstdFrames(raw)) as stream:
                yield stream
        else:
            yield raw


def _problem(path: str, problem: str, reason: str, on_error: OnError, line: int | None = None) -> None:
    """Raise, or count and log a skip."""
    error = InputFileError(path, problem, line)
    if on_error == "raise":
        raise error
    count(f"skipped/{reason}")
    logger.warning("skipping: %s", error)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def _decompression_error(error: Exception) -> bool:
    return isinstance(error, (gzip.BadGzipFile, EOFError)) or type(error).__module__.startswith("zstandard")


def _cut_short(path: str, compression: str, decompressed: int) -> InputFileError:
    """Compressed data that ends before its end marker (EOFError from gzip and :class:`ZstdFrames`)."""
    kind = {".gz": "gzip", ".zst": "zstd"}.get(compression, "compressed")
    return InputFileError(path, f"is cut short: its {kind} data ends early, after {decompressed:,} decompressed bytes")


def _lines(handle: IO[bytes], path: str, compression: str) -> Iterator[bytes]:
    """Raw lines of a (possibly compressed) file; a corrupt compressed stream names the file."""
    decompressed = 0  # of whole lines: a line the cut runs through is not given
    try:
        for line in handle:
            yield line
            decompressed += len(line)
    except EOFError:
        raise _cut_short(path, compression, decompressed) from None
    except OSError as error:
        raise InputFileError(path, f"cannot be read or decompressed ({error})") from None
    except Exception as error:
        if _decompression_error(error):
            raise InputFileError(path, f"cannot be decompressed ({error})") from None
        raise


# JSON may escape a UTF-16 surrogate, and Python's json reads one without its other half into a str
# that no encoder can write (it fails later, far from the file); only escapes can put one there.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(raw_line: bytes, value: Any) -> str | None:
    """The first lone surrogate in ``value``'s strings (keys too), as its escape; None when there is none."""
    if not _SURROGATE_ESCAPE.search(raw_line):
        return None
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                return f"\\u{ord(found.group()):04x}"
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


def _read_jsonl_numbered(path: str, on_error: OnError) -> Iterator[tuple[int, Any]]:
    _check_on_error(on_error)
    _, compression = input_format(path)
    empty = True
    with _open_binary(path, compression) as handle:
        for line_number, raw_line in enumerate(_lines(handle, path, compression), start=1):
            if not raw_line.strip():
                continue
            empty = False
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError:
                _problem(path, "is not UTF-8 text (a binary file?)", "not_utf8", on_error, line_number)
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                _problem(path, f"malformed JSON ({error.msg} at column {error.colno})", "malformed_json",
                         on_error, line_number)
                continue
            surrogate = _lone_surrogate(raw_line, value)
            if surrogate is not None:
                _problem(path, f"holds a lone surrogate escape ({surrogate}), half of a character: not text",
                         "lone_surrogate", on_error, line_number)
                continue
            yield line_number, value
    if empty:
        _problem(path, "is empty (no JSON lines)", "empty_file", on_error)


def read_jsonl(path: str, *, on_error: OnError = "raise") -> Iterator[Any]:
    """The JSON value of every non-blank line of a jsonl file."""
    for _, value in _read_jsonl_numbered(path, on_error):
        yield value


def read_text(path: str, *, separator: str | None = None, on_error: OnError = "raise") -> Iterator[str]:
    """A text file as one document, or as several split on ``separator`` (pieces stripped, blanks dropped)."""
    _check_on_error(on_error)
    _, compression = input_format(path)
    chunks: list[bytes] = []
    with _open_binary(path, compression) as handle:
        try:
            while chunk := handle.read(1 << 20):
                chunks.append(chunk)
        except EOFError:
            raise _cut_short(path, compression, sum(map(len, chunks))) from None
        except Exception as error:
            if isinstance(error, OSError) or _decompression_error(error):
                raise InputFileError(path, f"cannot be read or decompressed ({error})") from None
            raise
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        _problem(path, "is not UTF-8 text (a binary file?)", "not_utf8", on_error, line)
        return
    if not text.strip():
        _problem(path, "is empty", "empty_file", on_error)
        return
    if separator is None:
        yield text
        return
    for piece in text.split(separator):
        piece = piece.strip()
        if piece:
            yield piece


def read_parquet(path: str, *, columns: Sequence[str] | None = None, optional_columns: Sequence[str] = (),
                 on_error: OnError = "raise") -> Iterator[dict]:
    """Rows of a Parquet file as dicts, read one row group batch at a time.

    ``columns``: read only these (each must exist); ``optional_columns`` are read too where the file has them.
    """
    _check_on_error(on_error)
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, fs_path = url_to_fs(path)
    if not fs.exists(fs_path):
        raise InputNotFoundError(f"input path {path!r} does not exist")
    if fs.size(fs_path) == 0:
        _problem(path, "is empty", "empty_file", on_error)
        return
    with fs.open(fs_path, "rb") as handle:
        check_recorded_checksum(path, handle)
        try:
            parquet = pq.ParquetFile(handle)
        except (pa.ArrowInvalid, OSError) as error:
            _problem(path, f"is not a valid Parquet file ({error})", "invalid_parquet", on_error)
            return
        if columns is not None:
            missing = [c for c in columns if c not in parquet.schema_arrow.names]
            if missing:
                # A missing column is missing in every row: skipping would silently drop the whole file.
                raise InputFileError(path, f"has no column {missing[0]!r} (columns: {', '.join(parquet.schema_arrow.names)})")
            columns = [*columns, *(c for c in optional_columns if c in parquet.schema_arrow.names and c not in columns)]
        for batch in parquet.iter_batches(columns=list(columns) if columns is not None else None):
            yield from batch.to_pylist()


@dataclass(frozen=True)
class DocumentReader:
    """Reads the text documents of one file, whatever its format (a picklable callable for ``flat_map``).

    ``text_field``: the field of a jsonl record or Parquet column holding the text.
    ``separator``: for text files, split into documents on this string (e.g. ``"<|endoftext|>"``);
    None reads each text file as one document. A jsonl record or Parquet row with ``"kept": false`` is skipped:
    curation steps that mark rather than remove (deduplication, ``mode="mark"``) pass such
    documents on so every decision stays explainable, and they are not to be trained on.
    """

    text_field: str = "text"
    separator: str | None = None
    on_error: OnError = "raise"

    def __call__(self, path: str) -> Iterator[str]:
        _check_on_error(self.on_error)
        kind, _ = input_format(path)
        if kind == "text":
            yield from read_text(path, separator=self.separator, on_error=self.on_error)
        elif kind == "parquet":
            for row in read_parquet(path, columns=[self.text_field], optional_columns=["kept"], on_error=self.on_error):
                text = row[self.text_field]
                if isinstance(text, str):
                    if row.get("kept", True) is not False:
                        yield text
                else:
                    _problem(path, f"field {self.text_field!r} is {type(text).__name__}, not text", "missing_field",
                             self.on_error)
        else:
            yield from self._jsonl(path)

    def _jsonl(self, path: str) -> Iterator[str]:
        for line_number, record in _read_jsonl_numbered(path, self.on_error):
            text = record.get(self.text_field) if isinstance(record, dict) else None
            if isinstance(text, str):
                if record.get("kept", True) is not False:
                    yield text
                continue
            if not isinstance(record, dict):
                problem = f"expected a JSON object, got {type(record).__name__}"
            elif self.text_field not in record:
                fields = ", ".join(sorted(record)) or "none"
                problem = f"has no field {self.text_field!r} (fields: {fields})"
            else:
                problem = f"field {self.text_field!r} is {type(text).__name__}, not a string"
            _problem(path, problem, "missing_field", self.on_error, line_number)


@dataclass(frozen=True)
class FieldReader:
    """Reads one field of every record of one jsonl or Parquet file, with where each record is (a
    picklable callable for ``flat_map``).

    Yields ``(where, value)``: ``where`` names the record for error messages (``"<path>, line 7"``
    for jsonl, ``"<path>, row 3"`` for Parquet, counting from 1); the value is not checked, only
    that the field is there. Text files hold no records and are refused.
    """

    field: str
    on_error: OnError = "raise"

    def __call__(self, path: str) -> Iterator[tuple[str, Any]]:
        _check_on_error(self.on_error)
        kind, _ = input_format(path)
        if kind == "text":
            raise InputFileError(path, f"is a text file; records with a {self.field!r} field come from jsonl or Parquet files")
        if kind == "parquet":
            for row_number, row in enumerate(read_parquet(path, columns=[self.field], on_error=self.on_error), start=1):
                yield f"{path}, row {row_number}", row[self.field]
            return
        for line_number, record in _read_jsonl_numbered(path, self.on_error):
            if isinstance(record, dict) and self.field in record:
                yield f"{path}, line {line_number}", record[self.field]
                continue
            if isinstance(record, dict):
                problem = f"has no field {self.field!r} (fields: {', '.join(sorted(record)) or 'none'})"
            else:
                problem = f"expected a JSON object, got {type(record).__name__}"
            _problem(path, problem, "missing_field", self.on_error, line_number)


def read_documents(spec: str | Sequence[str], *, text_field: str = "text", separator: str | None = None,
                   on_error: OnError = "raise") -> Iterator[str]:
    """Every document of every file named by ``spec`` (in the driver process, sequentially)."""
    reader = DocumentReader(text_field, separator, on_error)
    for path in expand_input_files(spec):
        yield from reader(path)


def documents_dataset(spec: str | Sequence[str], *, text_field: str = "text", separator: str | None = None,
                      on_error: OnError = "raise") -> Dataset:
    """A dataset of documents with one shard per input file."""
    files = expand_input_files(spec)
    return Dataset.from_list(files, num_shards=len(files)).flat_map(DocumentReader(text_field, separator, on_error))


# -- Hugging Face datasets ---------------------------------------------------------------------

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT_ALIASES = {
    "train": ("train",),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test",),
}


def looks_like_hub_dataset_id(spec: str) -> bool:
    """``owner/name`` that is not an existing local path."""
    return bool(_HUB_ID.match(spec)) and not exists(spec)


@dataclass(frozen=True)
class HubDataset:
    """A resolved Hugging Face dataset: exact revision and the local files of each split."""

    repo_id: str
    revision: str  # the commit hash, which identifies the content
    local_dir: str
    splits: dict[str, list[str]]

    def files(self, split: str) -> list[str]:
        try:
            return self.splits[split]
        except KeyError:
            raise InputError(f"dataset {self.repo_id} has no split {split!r} (splits: {', '.join(self.splits)})") from None


def _split_of(relative_path: str) -> str | None:
    tokens = re.split(r"[^a-z]+", relative_path.lower())
    for split, aliases in _SPLIT_ALIASES.items():
        if any(alias in tokens for alias in aliases):
            return split
    return None


def _data_files(paths: Sequence[str]) -> list[str]:
    """The files worth reading: one format only, preferring Parquet, then jsonl, then text."""
    # Hub repos carry metadata next to the data (dataset cards, dataset_info.json): never documents.
    usable = [p for p in paths if _is_supported(p)
              and not os.path.basename(p).lower().startswith(("readme", "dataset_info", "dataset_dict", "state"))]
    for wanted in ("parquet", "jsonl", "text"):
        chosen = sorted(p for p in usable if input_format(p)[0] == wanted)
        if chosen:
            return chosen
    return []


def _splits_in(local_dir: str) -> dict[str, list[str]]:
    all_files = [os.path.relpath(os.path.join(root, name), local_dir)
                 for root, _, names in os.walk(local_dir) for name in names]
    splits: dict[str, list[str]] = {}
    for relative in _data_files(all_files):
        splits.setdefault(_split_of(relative) or "train", []).append(os.path.join(local_dir, relative))
    return splits


def resolve_hub_dataset(repo_id: str, *, revision: str | None = None, local_files_only: bool | None = None) -> HubDataset:
    """Find ``repo_id`` in the local Hugging Face cache, or download its data files when online.

    Offline (``HF_HUB_OFFLINE=1`` or ``local_files_only=True``) only the local cache is used; a
    dataset that is not there raises :class:`HubDatasetUnavailableError`, as does a hub that cannot
    be reached.
    """
    import huggingface_hub
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE if local_files_only is None else local_files_only
    local_dir, splits = None, {}
    try:
        local_dir = huggingface_hub.snapshot_download(repo_id, repo_type="dataset", revision=revision,
                                                      local_files_only=True)
        splits = _splits_in(local_dir)
    except Exception:  # noqa: BLE001 - any failure here just means "not in the local cache"
        pass
    if not splits:
        if offline:
            raise HubDatasetUnavailableError(
                f"Hugging Face dataset {repo_id!r} is not in the local cache ({constants.HF_HUB_CACHE}) and the hub "
                "is offline (HF_HUB_OFFLINE=1); download it once with network access, or point to local files"
            )
        try:
            files = huggingface_hub.HfApi().list_repo_files(repo_id, repo_type="dataset", revision=revision)
            local_dir = huggingface_hub.snapshot_download(repo_id, repo_type="dataset", revision=revision,
                                                          allow_patterns=_data_files(files) or None)
        except Exception as error:  # noqa: BLE001 - network, auth and not-found errors all land here
            raise HubDatasetUnavailableError(
                f"Hugging Face dataset {repo_id!r} is not in the local cache and could not be fetched from the hub "
                f"({type(error).__name__}: {error})"
            ) from error
        splits = _splits_in(local_dir)
        if not splits:
            raise HubDatasetUnavailableError(f"Hugging Face dataset {repo_id!r} holds no jsonl, parquet or text data files")
    # The snapshot folder is named after the commit: the content's identity, whatever ref was asked for.
    commit = os.path.basename(os.path.normpath(local_dir))
    return HubDataset(repo_id=repo_id, revision=commit, local_dir=local_dir, splits=splits)
