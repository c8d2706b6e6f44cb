"""Text extraction: HTML pages and WARC response records to documents with title, URL and language hints.

Inputs are ``.html``/``.htm`` files (optionally ``.gz``) and WARC files (``.warc``, ``.warc.gz``,
read with warcio; only ``response`` records with an HTML content type). Each page becomes
``{"text", "title", "url", "html_lang", "content_language"}``: the main text (boilerplate such as
navigation and footers left out), the ``<title>``, the WARC target URI (or the file's URL), the
``<html lang>`` attribute and the ``Content-Language`` header (or ``<meta http-equiv>``). Pages
with no main text are removed with reason ``extract_empty``; pages extraction must not run on (too
large, too deeply nested, not text) or whose extraction was stopped at its CPU limit (it runs in a
process of its own, :mod:`marin.curation.extraction_process`) are removed with their own reasons
(``extract_too_large``, ``extract_too_deep``, ``extract_not_text``, ``extract_timeout``; see
:mod:`marin.curation.page_guard` for the limits and why).

Two extractors are available; resiliparse is the default: on the sample in
``bench/curation_extractors.py`` both recover all of the article text, trafilatura lets a little
less boilerplate through (token precision 0.988 against 0.967), and resiliparse is about ten times
faster (see docs/data-curation.md); the C4 line rules downstream remove most short boilerplate lines.
"""

from __future__ import annotations

import gzip
import logging
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rigging import filesystem as fsx

from marin.curation.damaged_input import DamagedInputError
from marin.curation.extraction_process import extract_text as extract_text  # in this process, without a limit
from marin.curation.extraction_process import extract_within
from marin.curation.page_guard import MAX_PAGE_BYTES, PAGE_TIME_LIMIT_S, page_problem
from marin.curation.steps import OutputOptions, Verdict, curation_step
from marin.curation.warc import warc_records
from marin.execution.lazy import LazyStep

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

Extractor = Literal["resiliparse", "trafilatura"]
_HTML_SUFFIXES = (".html", ".htm", ".html.gz", ".htm.gz")
_WARC_SUFFIXES = (".warc", ".warc.gz")
_HTML_LANG = re.compile(rb"<html\b[^>]*?\blang\s*=\s*[\"']?([A-Za-z][\w-]*)", re.IGNORECASE)
_META_LANG = re.compile(rb"<meta\b[^>]*http-equiv\s*=\s*[\"']?content-language[\"']?[^>]*content\s*=\s*[\"']?([\w, -]+)", re.IGNORECASE)
_TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_CHARSET = re.compile(rb"<meta\b[^>]*charset\s*=\s*[\"']?([\w-]+)", re.IGNORECASE)


def is_web_input(path: str) -> bool:
    return path.lower().endswith(_HTML_SUFFIXES + _WARC_SUFFIXES)


def _decode(body: bytes, header_charset: str | None) -> str:
    match = _CHARSET.search(body[:4096])
    for charset in (header_charset, match.group(1).decode("ascii", "ignore") if match else None, "utf-8"):
        if charset:
            try:
                return body.decode(charset)
            except (LookupError, UnicodeDecodeError):
                continue
    return body.decode("utf-8", errors="replace")


def page_record(body: bytes, url: str, content_language: str | None, charset: str | None, extractor: Extractor) -> dict[str, Any]:
    """The page as a document; one that is not extracted (see :mod:`marin.curation.page_guard`) has no
    text and says why in ``extract_reason`` (the rule) and ``extract_detail`` (its figures)."""
    html = _decode(body, charset) if len(body) <= MAX_PAGE_BYTES else ""
    head = body[:65536]
    lang = _HTML_LANG.search(head)
    meta = _META_LANG.search(head)
    title = _TITLE.search(head)
    text, problem = _guarded_text(body, html, url, extractor)
    record = {
        "text": text,
        "title": re.sub(r"\s+", " ", _decode(title.group(1), charset)).strip() if title else None,
        "url": url,
        "html_lang": lang.group(1).decode("ascii").lower() if lang else None,
        "content_language": (content_language or (meta.group(1).decode("ascii").strip() if meta else None) or None),
    }
    if problem is not None:
        record["extract_reason"], record["extract_detail"] = problem
    return record


def _guarded_text(body: bytes, html: str, url: str, extractor: Extractor) -> tuple[str, tuple[str, str] | None]:
    problem = page_problem(body, html)
    if problem is not None:
        return "", problem
    text = extract_within(html, extractor, PAGE_TIME_LIMIT_S, url)
    if text is None:
        detail = f"extraction stopped at its limit of {PAGE_TIME_LIMIT_S:g} s of CPU"
        logger.warning("%s: %s; removed as extract_timeout (a limit on time depends on the machine)", url, detail)
        return "", ("extract_timeout", detail)
    return text, None


def _header_charset(content_type: str | None) -> str | None:
    match = re.search(r"charset=([\w-]+)", content_type or "", re.IGNORECASE)
    return match.group(1) if match else None


@dataclass(frozen=True)
class WebReader:
    """Picklable: an HTML or WARC file URL to one record per page."""

    extractor: Extractor = "resiliparse"

    def __call__(self, path: str) -> Iterator[dict]:
        lowered = path.lower()
        if lowered.endswith(_WARC_SUFFIXES):
            yield from self._warc(path)
            return
        with fsx.open_url(path, "rb") as handle:
            body = handle.read()
        if lowered.endswith(".gz"):
            try:
                body = gzip.decompress(body)
            except (EOFError, gzip.BadGzipFile, zlib.error) as error:
                raise DamagedInputError(path, f"cannot be decompressed ({error})", None, len(body)) from None
        yield page_record(body, path, None, None, self.extractor)

    def _warc(self, path: str) -> Iterator[dict]:
        for record, content in warc_records(path, _is_html_response):
            yield page_record(
                content,
                record.rec_headers.get_header("WARC-Target-URI"),
                record.http_headers.get_header("Content-Language"),
                _header_charset(record.http_headers.get_header("Content-Type")),
                self.extractor,
            )


def _is_html_response(record: Any) -> bool:
    if record.rec_type != "response" or record.http_headers is None:
        return False
    return "html" in (record.http_headers.get_header("Content-Type") or "").lower()


def _has_text(record: dict) -> Verdict:
    if record.get("extract_reason"):
        return Verdict(False, record["extract_reason"])
    return Verdict(True) if record["text"].strip() else Verdict(False, "extract_empty")


def extracted(
    name: str,
    source: Any,
    *,
    extractor: Extractor = "resiliparse",
    **options: Unpack[OutputOptions],
) -> LazyStep:
    """A lazy step extracting documents from HTML/WARC files (a file, folder, glob, URL or list)."""
    if extractor not in ("resiliparse", "trafilatura"):
        raise ValueError(f"extractor must be 'resiliparse' or 'trafilatura', not {extractor!r}")
    return curation_step(
        name, "extract", source, {"extractor": extractor}, lambda ctx: _has_text, reader=WebReader(extractor),
        accept=is_web_input, **options,
    )
