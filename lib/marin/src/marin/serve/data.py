"""Pages of a step's data files, read without loading a whole shard.

Only regular files inside the prefix are opened (see :mod:`rigging.regular_files`): a FIFO, a
device or a link out of the prefix is refused with :class:`UnreadableError`, never waited on.
Every page is bounded, whatever the file holds: a record shows at most :data:`MAX_RECORD_BYTES`
(a longer one is shown cut, with its size), a page at most :data:`MAX_PAGE` records and
:data:`MAX_PAGE_BYTES` of them, and one request reads at most :data:`MAX_SCAN_BYTES` of a file.
jsonl (plain, ``.gz``, ``.zst``) is streamed in chunks up to the end of the page, so a line of any
length is never held whole; parquet reads
only the row groups that overlap the page; a token cache reads only the page's documents (and at
most ``max_tokens`` tokens of each) through :class:`zephyr.token_cache.TokenCache`, and decodes them
with the tokenizer the cache was made with.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fsspec.compression import compr
from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError, check_regular, open_regular

from marin.execution.artifact import ArtifactError, load_artifact
from marin.execution.records.executor_files import ARTIFACT_FILE
from marin.serve.errors import NotFoundError, UnreadableError
from marin.serve.paths import relative_to

MAX_PAGE = 200  # records on one page, whatever ``count`` asks for
MAX_RECORD_BYTES = 64 * 1024  # of one record shown; a longer one is cut and its size given
MAX_PAGE_BYTES = 1 << 20  # of records on one page (the first record is always shown, cut)
MAX_SCAN_BYTES = 64 << 20  # read from one file per request, skipping to the page included
READ_CHUNK_BYTES = 64 * 1024
TEXT_PREVIEW_BYTES = 64 * 1024
CUT_KEY = "(record cut)"


@dataclass
class Page:
    kind: str  # "jsonl", "parquet", "tokens", "text", "folder"
    start: int
    rows: list[Any] = field(default_factory=list)
    total: int | None = None  # None when counting would mean reading the whole file
    has_more: bool = False
    note: str = ""
    next_start: int | None = None  # where the next page starts, when there is one

    def __post_init__(self) -> None:
        if self.next_start is None and self.has_more:
            self.next_start = self.start + len(self.rows)


def kind_of(url: str) -> str:
    fs, path = fsx.filesystem(url)
    if not fs.exists(path):
        raise NotFoundError(f"nothing at {url}")
    if fs.isdir(path):
        return "tokens" if fs.exists(f"{path.rstrip('/')}/ledger.json") else "folder"
    name = path.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def read_page(url: str, start: int = 0, count: int = 20, *, max_tokens: int = 512, prefix: str | None = None) -> Page:
    """A page of the file (or token cache) at ``url``; with ``prefix``, nothing outside it is opened."""
    start, count = max(0, int(start)), max(1, min(MAX_PAGE, int(count)))
    kind = kind_of(url)
    try:
        if kind == "jsonl":
            return _jsonl_page(url, start, count, prefix)
        if kind == "parquet":
            return _parquet_page(url, start, count, prefix)
        if kind == "tokens":
            return _token_page(url, start, count, max(1, min(4096, int(max_tokens))), prefix)
        if kind == "text":
            return _text_page(url, prefix)
    except RefusedFileError as exc:
        raise UnreadableError(str(exc)) from exc
    return Page(kind="folder", start=0)


@contextlib.contextmanager
def _open(url: str, within: str | None, compression: str | None = None) -> Iterator[io.IOBase]:
    """The file at ``url``, a regular file inside ``within``, decompressed as ``compression`` says."""
    with open_regular(url, within=within) as raw:
        if compression is None:
            yield raw
            return
        with compr[compression](raw, mode="rb") as stream:
            yield stream


def _compression(url: str) -> str | None:
    lower = url.lower()
    return "zstd" if lower.endswith(".zst") else "gzip" if lower.endswith(".gz") else None


def _lines(raw: Any, budget: int) -> Any:
    """``(head, size, complete)`` per line: its first :data:`MAX_RECORD_BYTES` bytes and its length.

    Reads in :data:`READ_CHUNK_BYTES` chunks and keeps only each line's head, so memory stays
    bounded on a line of any length. Stops after ``budget`` bytes, the line being read then given
    with ``complete=False`` (its size is then a lower bound).
    """
    head, size, scanned = bytearray(), 0, 0
    while True:
        chunk = raw.read(READ_CHUNK_BYTES)
        if not chunk:
            if size:
                yield bytes(head), size, True
            return
        scanned += len(chunk)
        position = 0
        while True:
            newline = chunk.find(b"\n", position)
            end = len(chunk) if newline < 0 else newline
            if len(head) < MAX_RECORD_BYTES:
                head += chunk[position : min(end, position + MAX_RECORD_BYTES - len(head))]
            size += end - position
            if newline < 0:
                break
            yield bytes(head), size, True
            head, size, position = bytearray(), 0, newline + 1
        if scanned >= budget:
            yield bytes(head), size, False
            return


def _size_text(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} bytes"


def _record(head: bytes, size: int, complete: bool) -> Any:
    text = head.decode("utf-8", errors="replace").rstrip("\r")
    if complete and size <= MAX_RECORD_BYTES:
        try:
            return json.loads(text)
        except ValueError:
            return {"(unparseable line)": text[:2000]}
    return {"bytes" if complete else "bytes_at_least": size, CUT_KEY: text}


def _jsonl_page(url: str, start: int, count: int, within: str | None) -> Page:
    rows: list[Any] = []
    shown, has_more, note, number = 0, False, "", -1
    scan_note = (f"stopped after reading {_size_text(MAX_SCAN_BYTES)} of the file, the most one page reads; "
                 "rows further on cannot be shown here")
    try:
        with _open(url, within, _compression(url)) as raw:
            for number, (head, size, complete) in enumerate(_lines(raw, MAX_SCAN_BYTES)):
                if not complete and (number < start or size == 0):
                    note = f"{scan_note} (reached row {number:,}, not row {start:,})" if number < start else scan_note
                    break
                if number < start:
                    continue
                cost = min(size, MAX_RECORD_BYTES)
                if len(rows) == count or (rows and shown + cost > MAX_PAGE_BYTES):
                    has_more = True
                    if len(rows) < count:
                        note = f"this page stops at {len(rows)} rows: a page shows at most {_size_text(MAX_PAGE_BYTES)} of records"
                    break
                rows.append(_record(head, size, complete))
                shown += cost
                if not complete:
                    note = scan_note
                    break
    except RefusedFileError:
        raise
    except (OSError, EOFError, ValueError) as exc:
        raise UnreadableError(f"{url} could not be read as jsonl ({type(exc).__name__}: {exc})") from exc
    return Page(kind="jsonl", start=start, rows=rows, has_more=has_more, note=note)


def _parquet_page(url: str, start: int, count: int, within: str | None) -> Page:
    import pyarrow.parquet as pq

    try:
        with _open(url, within) as handle:
            parquet = pq.ParquetFile(handle)
            total = parquet.metadata.num_rows
            rows: list[Any] = []
            group_start = 0
            for group in range(parquet.num_row_groups):
                group_rows = parquet.metadata.row_group(group).num_rows
                group_end = group_start + group_rows
                if group_end > start and group_start < start + count:
                    table = parquet.read_row_group(group)
                    lo = max(start, group_start) - group_start
                    hi = min(start + count, group_end) - group_start
                    rows.extend(table.slice(lo, hi - lo).to_pylist())
                if group_end >= start + count:
                    break
                group_start = group_end
    except RefusedFileError:
        raise
    except (OSError, ValueError) as exc:
        raise UnreadableError(f"{url} could not be read as parquet ({type(exc).__name__}: {exc})") from exc
    rows, note = _within_budget(rows)
    return Page(kind="parquet", start=start, rows=rows, total=total, has_more=start + len(rows) < total, note=note)


def _within_budget(rows: list[Any]) -> tuple[list[Any], str]:
    """Rows already read (a parquet row group is read whole), each cut to :data:`MAX_RECORD_BYTES` as
    JSON and no more than :data:`MAX_PAGE_BYTES` of them, so the page sent stays small."""
    kept, shown = [], 0
    for row in rows:
        text = json.dumps(row, ensure_ascii=False, default=str)
        size = len(text.encode("utf-8"))
        cost = min(size, MAX_RECORD_BYTES)
        if kept and shown + cost > MAX_PAGE_BYTES:
            return kept, f"this page stops at {len(kept)} rows: a page shows at most {_size_text(MAX_PAGE_BYTES)} of records"
        kept.append(row if size <= MAX_RECORD_BYTES else {"bytes": size, CUT_KEY: text.encode("utf-8")[:MAX_RECORD_BYTES].decode("utf-8", errors="ignore")})
        shown += cost
    return kept, ""


def _text_page(url: str, within: str | None) -> Page:
    with _open(url, within) as handle:
        data = handle.read(TEXT_PREVIEW_BYTES + 1)
    truncated = len(data) > TEXT_PREVIEW_BYTES
    text = data[:TEXT_PREVIEW_BYTES].decode("utf-8", errors="replace")
    note = f"first {TEXT_PREVIEW_BYTES // 1024} KiB shown" if truncated else ""
    return Page(kind="text", start=0, rows=[text], note=note)


# -- token caches ---------------------------------------------------------------------------------

_TOKENIZERS: dict[str, Any] = {}
_TOKENIZERS_LOCK = threading.Lock()
# Sources that failed to load, with when and why: a hub id that cannot be reached costs the hub
# client's retries (about 24 s), which every page would pay again without this.
_FAILED: dict[str, tuple[float, str]] = {}
FAILED_RETRY_S = 300.0


def _load_tokenizer_cached(source: str) -> Any:
    from levanter.tokenization import load_tokenizer

    with _TOKENIZERS_LOCK:
        if source in _TOKENIZERS:
            return _TOKENIZERS[source]
        failed = _FAILED.get(source)
        if failed is not None and time.monotonic() - failed[0] < FAILED_RETRY_S:
            raise LookupError(f"{failed[1]} (not retried for {FAILED_RETRY_S:.0f} s)")
    try:
        tokenizer = load_tokenizer(source)
    except Exception as exc:
        with _TOKENIZERS_LOCK:
            _FAILED[source] = (time.monotonic(), str(exc))
        raise
    with _TOKENIZERS_LOCK:
        _FAILED.pop(source, None)
        if len(_TOKENIZERS) >= 8:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[source] = tokenizer
    return tokenizer


def _tokenizer_candidates(cache_url: str, metadata: dict[str, Any], prefix: str | None) -> list[str]:
    """Where the cache's tokenizer may be loaded from, most specific first.

    The ledger records the tokenizer's identity (a digest); where to load it from is in the ledger
    when its writer put it there, else in the record of the step that made the cache (the cache is
    a folder inside that step's output, and its result names ``tokenizer_source``).
    """
    candidates = [metadata[key] for key in ("tokenizer_source", "tokenizer_path") if isinstance(metadata.get(key), str)]
    recorded = metadata.get("tokenizer")
    if isinstance(recorded, str) and not recorded.startswith("sha256:"):
        candidates.append(recorded)
    folder = cache_url.rstrip("/")
    for _ in range(4):
        if prefix is not None and relative_to(prefix, folder) in (None, ""):
            break
        if _readable(fsx.join(folder, ARTIFACT_FILE), prefix):
            # Read as the runner reads it: a path it stored relative to the prefix or the step's
            # folder (the built-in tokenizer's, say) comes back whole, not as a would-be hub id.
            try:
                result = load_artifact(folder, prefix=prefix).result or {}
            except ArtifactError:
                result = {}
            for key in ("tokenizer_source", "tokenizer"):
                value = result.get(key) if isinstance(result, dict) else None
                if isinstance(value, str) and not value.startswith("sha256:"):
                    candidates.append(value)
            break
        folder = folder.rsplit("/", 1)[0]
    return candidates


def _readable(url: str, within: str | None) -> bool:
    """Whether ``url`` is a regular file inside ``within``: what may be handed to a reader that opens it itself."""
    try:
        check_regular(url, within=within)
    except (FileNotFoundError, NotADirectoryError, RefusedFileError):
        return False
    return fsx.exists(url)


def _check_cache_files(url: str, within: str | None) -> None:
    """:class:`RefusedFileError` for the first file of the cache that is no regular file or leads
    out of ``within``: the cache's reader opens them itself, and must never wait on one."""
    if fsx.is_local(url):
        for name in fsx.find_files(url):
            check_regular(fsx.join(url, name), within=within)


def cache_tokenizer(cache_url: str, metadata: dict[str, Any], prefix: str | None = None) -> tuple[Any | None, str]:
    """``(tokenizer, note)``: the tokenizer the cache records, checked against its identity when recorded."""
    expected = metadata.get("tokenizer") if str(metadata.get("tokenizer", "")).startswith("sha256:") else None
    problems = []
    for source in _tokenizer_candidates(cache_url, metadata, prefix):
        try:
            tokenizer = _load_tokenizer_cached(source)
        except Exception as exc:  # noqa: BLE001 - any failure to load is reported on the page
            problems.append(f"{source}: {exc}")
            continue
        if expected and tokenizer.identity != expected:
            problems.append(f"{source} has identity {tokenizer.identity[:19]}..., not the cache's {expected[:19]}...")
            continue
        return tokenizer, f"decoded with {source}"
    why = "; ".join(problems) if problems else "the cache does not say where its tokenizer is"
    return None, f"token ids shown undecoded ({why})"


def _token_page(url: str, start: int, count: int, max_tokens: int, prefix: str | None = None) -> Page:
    from zephyr.token_cache import TokenCache, TokenCacheError

    _check_cache_files(url, prefix)
    try:
        cache = TokenCache.open(url, verify_checksums=False)
    except (TokenCacheError, OSError, ValueError, KeyError) as exc:
        raise UnreadableError(f"token cache {url} could not be opened ({exc})") from exc
    tokenizer, note = cache_tokenizer(url, cache.metadata, prefix)
    rows = []
    stop = min(cache.num_documents, start + count)
    for index in range(start, stop):
        ids = cache.document(index)
        length = len(ids)
        shown = ids[:max_tokens].tolist()
        pieces = [tokenizer.tokenizer.decode([i], skip_special_tokens=False) for i in shown] if tokenizer else None
        rows.append({"document": index, "length": length, "ids": shown, "pieces": pieces})
    return Page(kind="tokens", start=start, rows=rows, total=cache.num_documents, has_more=stop < cache.num_documents,
                note=note + f"; at most {max_tokens} tokens per document shown")
