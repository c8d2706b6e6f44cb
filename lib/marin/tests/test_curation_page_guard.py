"""Extraction never stalls a shard: pages too large, too deeply nested or not text are removed with
their own reason before extraction runs, and a page past the time limit is removed too."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from marin.curation import extract, page_guard
from marin.curation.extract import extracted
from marin.curation.extraction_process import extract_within
from marin.curation.page_guard import MAX_DEPTH, MAX_NESTING, MAX_PAGE_BYTES, nesting
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner

ARTICLE = "<p>The lighthouse keeper climbed the stairs every evening to light the great lamp for the ships.</p>"
PAGE = f"<html><head><title>Keeper</title></head><body><article>{ARTICLE * 3}</article></body></html>"


def _extract(tmp_path: Path, pages: dict[str, bytes]) -> tuple[list[dict], list[dict]]:
    folder = tmp_path / "in"
    folder.mkdir()
    for name, body in pages.items():
        (folder / name).write_bytes(body)
    handle = extracted("curated/pages", str(folder), backend="inline")
    runner = StepRunner(prefix=str(tmp_path / "p"))
    runner.run([handle])
    result = load_artifact(runner.output_path_for(handle), CuratedDataset).result
    return read_curated(result.files), read_curated(result.removed_files)


def _reasons(removed: list[dict]) -> dict[str, str]:
    return {Path(r["url"]).name: r["reason"] for r in removed}


def test_deeply_nested_and_oversized_pages_are_removed_with_their_own_reasons(tmp_path):
    deep = "<html><body>" + "<div>" * 200_000 + "x"  # 1.0 MB; about 25 minutes of extraction
    wide = "<html><body>" + ("<div>" * 64 + "hello " + "</div>" * 64) * 500  # each 64 deep, 500 times
    huge = "<html><body>" + ARTICLE * (MAX_PAGE_BYTES // len(ARTICLE) + 1)
    kept, removed = _extract(tmp_path, {"deep.html": deep.encode(), "wide.html": wide.encode(),
                                        "huge.html": huge.encode(), "good.html": PAGE.encode()})
    assert [Path(r["url"]).name for r in kept] == ["good.html"]
    assert _reasons(removed) == {"deep.html": "extract_too_deep", "wide.html": "extract_too_deep",
                                 "huge.html": "extract_too_large"}
    details = {Path(r["url"]).name: r["extract_detail"] for r in removed}
    assert details["deep.html"] == f"elements nested {2 + 200_000:,} deep (limit {MAX_DEPTH})"  # under html, body
    # html and body at depths 1 and 2, then 500 times divs at depths 3..66
    assert details["wide.html"] == f"element depths sum to {1 + 2 + 500 * sum(range(3, 67)):,} (limit {MAX_NESTING:,})"
    assert "extract_reason" not in kept[0] and "extract_detail" not in kept[0]


def test_a_page_of_random_bytes_is_removed_as_not_text(tmp_path):
    noise = random.Random(0).randbytes(20_000)
    kept, removed = _extract(tmp_path, {"noise.html": noise, "good.html": PAGE.encode()})
    assert [Path(r["url"]).name for r in kept] == ["good.html"]
    assert _reasons(removed) == {"noise.html": "extract_not_text"}
    assert removed[0]["text"] == ""


_RUN_WITH_A_SMALL_LIMIT = """
import json, sys
from pathlib import Path
from marin.curation import extract
from marin.curation.extract import extracted
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner

extract.PAGE_TIME_LIMIT_S = 0.2
folder, prefix = sys.argv[1:]
handle = extracted("curated/pages", folder, backend="inline")
runner = StepRunner(prefix=prefix)
runner.run([handle])
result = load_artifact(runner.output_path_for(handle), CuratedDataset).result
print(json.dumps({"kept": [Path(r["url"]).name for r in read_curated(result.files)],
                  "removed": {Path(r["url"]).name: r["reason"] for r in read_curated(result.removed_files)}}))
"""


def test_a_page_past_the_cpu_limit_is_stopped_there_whatever_its_markup_and_the_next_page_is_extracted(tmp_path):
    # An HTML parser opens a <div/> (the slash only closes foreign elements) and ignores a stray </x>,
    # so both pages nest 60,000 deep while the guards' scan sees them flat: unstopped, each would take
    # minutes of CPU (a third of this size takes about 9 s).
    pages = {"a-self-closed.html": "<html><body>" + "<div/>" * 60_000 + "x",
             "b-stray-ends.html": "<html><body>" + "<div></x>" * 60_000 + "x",
             "c-good.html": PAGE}
    (tmp_path / "in").mkdir()
    for name, page in pages.items():
        assert page_guard.page_problem(page.encode(), page) is None, name  # only the CPU limit can stop them
        (tmp_path / "in" / name).write_text(page)
    # In a process of its own with a 0.2 s limit: a page the limit does not stop fails the test at the
    # timeout instead of keeping it busy.
    done = subprocess.run([sys.executable, "-c", _RUN_WITH_A_SMALL_LIMIT, str(tmp_path / "in"), str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"kept": ["c-good.html"],
                       "removed": {"a-self-closed.html": "extract_timeout", "b-stray-ends.html": "extract_timeout"}}
    assert "extraction stopped at its limit of 0.2 s of CPU" in done.stderr


def test_extraction_in_its_process_gives_the_text_extraction_in_this_one_gives():
    for extractor in ("resiliparse", "trafilatura"):
        assert extract_within(PAGE, extractor, 5.0, "page") == extract.extract_text(PAGE, extractor) != ""
    with pytest.raises(ValueError, match="CPU limit per page must be above 0"):
        extract_within(PAGE, "resiliparse", 0.0, "page")


class _DepthReference(HTMLParser):
    """Depths from Python's own HTML tokenizer, with the same rules: void, self-closing and
    sibling-closed tags do not nest."""

    def __init__(self):
        super().__init__()
        self.depth = self.deepest = self.total = 0

    UNCOUNTED = {"area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta", "param",
                 "source", "track", "wbr",  # void
                 "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody", "tfoot", "colgroup",
                 "caption", "rb", "rt", "rp", "rtc"}  # closed by their next sibling: never nested by the page alone

    def handle_starttag(self, tag, attrs):
        if tag not in self.UNCOUNTED:
            self.depth += 1
            self.total += self.depth
            self.deepest = max(self.deepest, self.depth)

    def handle_startendtag(self, tag, attrs):
        pass  # <path ... />: opens nothing

    def handle_endtag(self, tag):
        if tag not in self.UNCOUNTED:
            self.depth = max(0, self.depth - 1)


def test_the_nesting_scan_agrees_with_pythons_html_tokenizer():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from curation_extractors import sample

    pages = [page for page, _ in sample(12)]
    pages.append("<html><body><svg><path d='M0 0'/><circle r='1'/></svg><script>if (a<b && c>d) {}</script>"
                 "<!-- <div><div> --><table><tr><td>x</td></tr></table><br><IMG src=x><p>y</p></body></html>")
    pages.append("<div>" * 700 + "</div>" * 700 + "<span>x</span>")
    pages.append("<ul>" + "<li>item" * 2000 + "</ul><table>" + "<tr><td>a<td>b" * 900 + "</table>" + "<p>text" * 900)
    pages.append("<div></p>" * 600)  # a stray </p> does not close the <div>s
    for page in pages:
        reference = _DepthReference()
        reference.feed(page)
        reference.close()
        assert nesting(page.encode()) == (reference.deepest, reference.total), page[:80]


def test_ordinary_pages_pass_every_guard():
    big = PAGE.replace("</article>", ARTICLE * 5000 + "</article>")
    assert page_guard.page_problem(PAGE.encode(), PAGE) is None
    assert page_guard.page_problem(big.encode(), big) is None
    old_style = "<html><body><ul>" + "<li>an item" * 3000 + "</ul>" + "<p>a paragraph" * 3000  # end tags left out
    assert page_guard.page_problem(old_style.encode(), old_style) is None
