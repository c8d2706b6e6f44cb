"""Which pages extraction may run on, and how long it may take: so no page stalls a shard.

Extraction cost is not linear in a page's size. resiliparse's main-content pass costs about the
sum, over the page's elements, of each element's depth: 200,000 nested ``<div>`` (1.2 MB) kept a
shard busy for 25 minutes, and 4,000 take about 0.5 s of CPU (``bench/extraction_guards.py``).
The extractor is one call into C, which no Python thread or signal handler interrupts, so a time
limit is enforced outside it: each page is extracted in a process of its own that the kernel ends
once the page has spent its CPU budget (:mod:`marin.curation.extraction_process`). Every page first
passes guards checked by one linear scan, which name what is wrong before any CPU is spent on it:

- ``MAX_PAGE_BYTES`` (1 MiB, reason ``extract_too_large``): web crawls cut pages near this size
  (Common Crawl truncates payloads at 1 MiB), and a flat page this size (23,000 paragraphs) is
  extracted in about 0.12 s of CPU.
- ``MAX_DEPTH`` (512, reason ``extract_too_deep``): Chromium's HTML parser stops nesting elements
  at depth 512, so a browser never shows a deeper page as nested; real pages stay under about 100.
- ``MAX_NESTING`` (1,000,000, reason ``extract_too_deep``): the sum of element depths, the cost
  that grows with the square of the depth. A page at the limit (500 blocks of 64 nested ``<div>``)
  takes about 0.16 s of CPU; a large real page (20,000 elements at depth 20) is at 400,000.
- text, not bytes (reason ``extract_not_text``): a page whose decoded text is more than
  ``MAX_GARBAGE_SHARE`` replacement or control characters is binary or in an encoding it does not
  declare (a file of random bytes decodes to mostly U+FFFD); there is no text to extract.
- ``PAGE_TIME_LIMIT_S`` (1 s, reason ``extract_timeout``), as other extraction pipelines use: a
  page that passed the guards is stopped when its extraction has spent this much CPU (CPU time, so
  a busy machine does not count) and removed. The guards keep every page they pass far below it,
  so the limit only meets shapes the guards do not know, such as a page of ``<div/>`` or of
  ``<div></x>``, which the scan below reads as flat and a parser nests; as a measure of time it
  can differ between machines, so such a removal is also logged.

The depth scan counts start and end tags (void elements, self-closing tags and anything inside
comments, scripts and styles do not nest, and elements whose end tags HTML lets a page leave out,
such as ``<p>``, ``<li>`` and ``<td>``, are not counted), vectorised with numpy. It does not model
the rest of HTML's tree building (a stray end tag closes the innermost element counted), so the
limits sit far above real pages.
"""

from __future__ import annotations

import re

import numpy as np

MAX_PAGE_BYTES = 1024 * 1024
MAX_DEPTH = 512
MAX_NESTING = 1_000_000
MAX_GARBAGE_SHARE = 0.1
PAGE_TIME_LIMIT_S = 1.0

_VOID = (b"area", b"base", b"br", b"col", b"embed", b"hr", b"img", b"input", b"keygen", b"link", b"meta", b"param",
         b"source", b"track", b"wbr")
# Elements a start tag of their own kind (or their parent's end) closes: in a browser, <p><p> or
# <li><li> are siblings. Their tags are not counted at all (start or end), so a page of unclosed
# paragraphs is not deep, and a stray </p> cannot hide real nesting by seeming to close a <div>.
_IMPLIED = (b"p", b"li", b"dt", b"dd", b"tr", b"td", b"th", b"option", b"optgroup", b"thead", b"tbody", b"tfoot",
            b"colgroup", b"caption", b"rb", b"rt", b"rp", b"rtc")
_NAME_BYTES = 8  # a tag name is compared by its first 8 bytes, packed into one integer; these names are shorter
_UNCOUNTED_KEYS = np.sort([np.frombuffer(name.ljust(_NAME_BYTES, b"\0"), np.uint64)[0] for name in _VOID + _IMPLIED])
_RAW = ((b"<!--", b"-->"), (b"<script", b"</script"), (b"<style", b"</style"))
_GARBAGE = re.compile("[\ufffd\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
_SAMPLE_CHARS = 16384


def _outside_raw_text(page: bytes, starts: np.ndarray, closing: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Which ``<`` are outside comments, scripts and styles, whose ``<`` open nothing (a script's ``i<n``)."""
    opening = np.zeros(len(starts), bool)
    for name, _ in _RAW:
        name = name[1:]  # what follows the "<"
        matches = np.ones(len(starts), bool)
        for i, char in enumerate(name):
            matches &= window[:, i] == char
        opening |= matches & ~closing
    if not opening.any():
        return np.ones(len(starts), bool)
    lowered = page.lower()
    begins, stops = [], []
    for at in starts[opening].tolist():
        if stops and at < stops[-1]:
            continue  # inside an earlier comment, script or style
        end = next(end for begin, end in _RAW if lowered.startswith(begin, at))
        stop = lowered.find(end, at + 1)
        begins.append(at)
        stops.append(len(page) if stop < 0 else stop)
    # each "<" against the span that begins last before it: one pass, however many spans
    which = np.searchsorted(np.array(begins), starts, side="left") - 1
    return (which < 0) | (starts >= np.array(stops)[np.maximum(which, 0)])


def nesting(page: bytes) -> tuple[int, int]:
    """``(maximum depth, sum of depths)`` of the elements of ``page``, from its tags alone.

    Vectorised over the tags with numpy, so it costs a part of what extraction does.
    """
    data = np.frombuffer(page, np.uint8)
    padded = np.concatenate([data, np.zeros(_NAME_BYTES + 2, np.uint8)])
    starts = np.flatnonzero(data == ord("<"))
    closing = padded[starts + 1] == ord("/")
    # the name, after "<" or "</", lower-cased (| 0x20 lowers letters and keeps digits)
    window = padded[(starts + 1 + closing)[:, None] + np.arange(_NAME_BYTES + 1)] | 0x20
    outside = _outside_raw_text(page, starts, closing, window)
    if not outside.all():
        starts, closing, window = starts[outside], closing[outside], window[outside]
    if not len(starts):
        return 0, 0
    is_letter = (window >= ord("a")) & (window <= ord("z"))
    in_name = np.cumprod(is_letter | ((window >= ord("0")) & (window <= ord("9"))), axis=1, dtype=np.uint8)
    names = window[:, :_NAME_BYTES] * in_name[:, :_NAME_BYTES]
    keys = np.ascontiguousarray(names).view(np.uint64).ravel()
    found = _UNCOUNTED_KEYS[np.minimum(np.searchsorted(_UNCOUNTED_KEYS, keys), len(_UNCOUNTED_KEYS) - 1)]
    counted = is_letter[:, 0] & (found != keys)
    closes = closing & counted
    opens = ~closing & counted
    ends = np.flatnonzero(data == ord(">"))
    if len(ends):
        following = ends[np.minimum(np.searchsorted(ends, starts), len(ends) - 1)]
        opens &= ~((following > starts) & (data[np.maximum(following - 1, 0)] == ord("/")))  # <path ... />
    tags = opens | closes
    steps = opens[tags].astype(np.int64) - closes[tags]
    if not len(steps):
        return 0, 0
    walk = np.cumsum(steps)
    depth = walk - np.minimum(np.minimum.accumulate(walk), 0)  # never below 0: a stray end tag closes nothing
    return int(depth.max()), int(depth[steps > 0].sum())


def page_problem(page: bytes, html: str) -> tuple[str, str] | None:
    """``(reason, detail)`` when ``page`` (its bytes), decoded to ``html``, must not be extracted."""
    if len(page) > MAX_PAGE_BYTES:
        return "extract_too_large", f"{len(page):,} bytes (limit {MAX_PAGE_BYTES:,})"
    sample = html[:_SAMPLE_CHARS]
    garbage = len(_GARBAGE.findall(sample))
    if sample and garbage > MAX_GARBAGE_SHARE * len(sample):
        return "extract_not_text", f"{garbage / len(sample):.0%} of the first {len(sample):,} characters are not text"
    # Fewer tags than MAX_DEPTH can be neither too deep nor (MAX_NESTING > MAX_DEPTH**2 / 2) too nested.
    if page.count(b"<") > MAX_DEPTH:
        deepest, total = nesting(page)
        if deepest > MAX_DEPTH:
            return "extract_too_deep", f"elements nested {deepest:,} deep (limit {MAX_DEPTH})"
        if total > MAX_NESTING:
            return "extract_too_deep", f"element depths sum to {total:,} (limit {MAX_NESTING:,})"
    return None
