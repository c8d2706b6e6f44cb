"""Text extraction: main text without boilerplate, with title, URL and language hints, from HTML and WARC."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from marin.curation.extract import extract_text, extracted
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

ARTICLE = ["The lighthouse keeper climbed the stairs every evening to light the great lamp for the ships.",
           "One stormy night a small boat lost its way, and the keeper waved his lantern until the sailors saw the rocks.",
           "In the morning the sailors came to thank him, and they brought fresh bread and a basket of apples."]
PAGE = ("<html lang='en-GB'><head><title>The Keeper</title><meta http-equiv='content-language' content='en'></head><body>"
        "<nav><a href='/'>Home</a> <a href='/news'>News</a> <a href='/contact'>Contact</a></nav>"
        "<article>" + "".join(f"<p>{p}</p>" for p in ARTICLE) + "</article>"
        "<footer>Copyright 2024 Example Media. All rights reserved. Privacy policy.</footer></body></html>")


@pytest.mark.parametrize("extractor", ["resiliparse", "trafilatura"])
def test_main_text_is_recovered_without_boilerplate(extractor):
    text = extract_text(PAGE, extractor)
    assert all(p in text for p in ARTICLE)
    assert "Copyright" not in text and "Contact" not in text


def _warc(path: Path) -> None:
    with open(path, "wb") as handle:
        writer = WARCWriter(handle, gzip=True)
        for uri, body, headers in [
            ("https://example.org/keeper", PAGE.encode(), [("Content-Type", "text/html; charset=utf-8"), ("Content-Language", "en")]),
            ("https://example.org/logo.png", b"\x89PNG", [("Content-Type", "image/png")]),
            ("https://example.org/empty", b"<html><body><nav><a href='/'>Home</a></nav></body></html>", [("Content-Type", "text/html")]),
        ]:
            http = StatusAndHeaders("200 OK", headers, protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(uri, "response", payload=io.BytesIO(body), http_headers=http))


def test_step_reads_html_and_warc_and_keeps_metadata(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "page.html").write_text(PAGE)
    _warc(tmp_path / "in" / "crawl.warc.gz")
    handle = extracted("curated/extracted", str(tmp_path / "in"), backend="inline")
    runner = StepRunner(prefix=str(tmp_path / "p"))
    runner.run([handle])
    result = load_artifact(runner.output_path_for(handle), CuratedDataset).result
    kept = read_curated(result.files)
    assert [r["url"] for r in kept] == ["https://example.org/keeper", str(tmp_path / "in" / "page.html")]
    for record in kept:
        assert all(p in record["text"] for p in ARTICLE) and "Copyright" not in record["text"]
        assert (record["title"], record["html_lang"], record["content_language"]) == ("The Keeper", "en-gb", "en")
    removed = read_curated(result.removed_files)
    assert [(r["url"], r["reason"]) for r in removed] == [("https://example.org/empty", "extract_empty")]
    assert result.summary["documents_in"] == 3 and result.summary["documents_out"] == 2
