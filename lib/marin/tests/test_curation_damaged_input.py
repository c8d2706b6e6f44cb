"""Damaged input files: a curation step fails naming the file and how far it was read, or, with
``on_damaged_input="skip"``, goes on and counts the damaged files and what was lost."""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path

import pytest
from marin.curation.extract import extracted
from marin.curation.quality import quality_filtered
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lower
from marin.execution.records.run_report import StepRunFailed
from marin.execution.step_runner import StepRunner
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

PAGE = ("<html><head><title>The Keeper</title></head><body><article>"
        "<p>The lighthouse keeper climbed the stairs every evening to light the great lamp for the ships.</p>"
        "<p>One stormy night a small boat lost its way, and the keeper waved his lantern until the sailors saw the rocks.</p>"
        "</article></body></html>")
STORY = ("The little fox ran through the green forest to find her friends near the old river. "
         "She saw a bird, a frog and a rabbit playing by the water, and they all laughed together in the sun.")


def _warc(path: Path) -> None:
    """Three records, each its own gzip member: two HTML pages and an image."""
    with open(path, "wb") as handle:
        writer = WARCWriter(handle, gzip=True)
        for uri, body, kind in [("https://example.org/keeper", PAGE.encode(), "text/html; charset=utf-8"),
                                ("https://example.org/logo.png", b"\x89PNG" * 50, "image/png"),
                                ("https://example.org/keeper-again", PAGE.encode(), "text/html")]:
            http = StatusAndHeaders("200 OK", [("Content-Type", kind)], protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(uri, "response", payload=io.BytesIO(body), http_headers=http))


def _run(handle, prefix: Path) -> CuratedDataset:
    runner = StepRunner(prefix=str(prefix))
    runner.run([handle])
    return load_artifact(runner.output_path_for(handle), CuratedDataset).result


def _failure(handle, prefix: Path) -> str:
    with pytest.raises(StepRunFailed) as failed:
        StepRunner(prefix=str(prefix)).run([handle])
    return str(failed.value)


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A folder with an intact WARC and a copy of it cut at 2/3 of its length."""
    folder = tmp_path / "in"
    folder.mkdir()
    _warc(folder / "a-good.warc.gz")
    whole = (folder / "a-good.warc.gz").read_bytes()
    (folder / "b-cut.warc.gz").write_bytes(whole[: len(whole) * 2 // 3])
    return folder, folder / "b-cut.warc.gz"


def test_a_truncated_warc_fails_the_step_naming_the_file_and_how_far_it_was_read(tmp_path):
    folder, cut = _inputs(tmp_path)
    message = _failure(extracted("curated/extracted", str(folder), backend="inline"), tmp_path / "p")
    line = next(line for line in message.splitlines() if "b-cut.warc.gz" in line)
    assert "damaged" in line and "read 1 document" in line and f"of {cut.stat().st_size:,} bytes" in line, message
    assert "on_damaged_input='skip'" in line
    assert "Traceback" not in message and "warcio" not in message


def test_a_warc_of_random_bytes_is_named_without_its_bytes_or_a_traceback(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "noise.warc.gz").write_bytes(random.Random(0).randbytes(3000))
    (folder / "plain-noise.warc").write_bytes(random.Random(1).randbytes(3000))
    message = _failure(extracted("curated/extracted", str(folder), backend="inline"), tmp_path / "p")
    assert "noise.warc.gz" in message and "not a WARC file" in message, message
    assert "ArchiveLoadFailed" not in message and "first line" not in message and "Traceback" not in message
    assert len(message.splitlines()) == 2  # "1 step(s) failed:" and the step's one line


def test_with_skip_the_step_goes_on_and_its_summary_counts_what_was_lost(tmp_path):
    folder, cut = _inputs(tmp_path)
    result = _run(extracted("curated/extracted", str(folder), backend="inline", on_damaged_input="skip"), tmp_path / "p")
    urls = [r["url"] for r in read_curated(result.files)]
    # the intact file's page, and the page read from the cut file before the damage
    assert urls == ["https://example.org/keeper", "https://example.org/keeper-again", "https://example.org/keeper"]
    damaged = result.summary["damaged"]
    assert damaged["files"] == 1 and damaged["documents_read"] == 1
    (only,) = damaged["by_file"]
    assert only["path"] == str(cut) and "gzip data ends early" in only["problem"]
    assert only["bytes_total"] == cut.stat().st_size


def test_a_truncated_jsonl_gz_fails_or_is_skipped_with_the_documents_read_before_the_damage(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    lines = "".join(json.dumps({"id": str(i), "text": f"{STORY} Story number {i}."}) + "\n" for i in range(400))
    whole = gzip.compress(lines.encode(), mtime=0)
    (folder / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (folder / "good.jsonl").write_text(lines)
    message = _failure(quality_filtered("curated/quality", str(folder), backend="inline"), tmp_path / "p")
    assert "cut.jsonl.gz" in message and "damaged" in message and "Traceback" not in message, message

    result = _run(quality_filtered("curated/quality", str(folder), backend="inline", on_damaged_input="skip"), tmp_path / "q")
    damaged = result.summary["damaged"]
    assert damaged["files"] == 1 and 0 < damaged["documents_read"] < 400
    assert result.summary["documents_in"] == 400 + damaged["documents_read"]


def test_the_option_moves_no_existing_hash_and_skip_has_its_own(tmp_path):
    folder, _ = _inputs(tmp_path)
    default = lower(extracted("curated/extracted", str(folder)))[-1]
    explicit = lower(extracted("curated/extracted", str(folder), on_damaged_input="fail"))[-1]
    skip = lower(extracted("curated/extracted", str(folder), on_damaged_input="skip"))[-1]
    assert set(default.identity_record["hash_attrs"]) == {"curation", "config", "input", "text_field", "mode", "output_format"}
    assert default.identity == explicit.identity != skip.identity
    with pytest.raises(ValueError, match="on_damaged_input must be 'fail' or 'skip'"):
        extracted("curated/extracted", str(folder), on_damaged_input="ignore")


def test_an_uncompressed_warc_cut_inside_a_record_or_its_header_is_damaged(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    _warc(tmp_path / "whole.warc.gz")
    plain = gzip.decompress((tmp_path / "whole.warc.gz").read_bytes())
    last = plain.rindex(b"WARC/1.0")
    cuts = {"body": len(plain) - 40, "header": last + len(b"WARC/1.0\r\nWARC-Type: resp")}
    for where, cut in cuts.items():
        (folder / "crawl.warc").write_bytes(plain[:cut])
        message = _failure(extracted(f"curated/{where}", str(folder), backend="inline"), tmp_path / where)
        expected = "record 3 lacks" if where == "body" else "record 3 has no Content-Length"
        assert "crawl.warc: damaged input" in message and expected in message and "read 1 document " in message, message


def test_skip_counts_damage_the_same_from_worker_processes(tmp_path):
    folder, cut = _inputs(tmp_path)
    result = _run(extracted("curated/extracted", str(folder), backend="processes", on_damaged_input="skip"), tmp_path / "p")
    assert result.summary["damaged"]["files"] == 1 and result.summary["documents_out"] == 3
    assert result.summary["damaged"]["by_file"][0]["path"] == str(cut)


def test_deduplication_fails_on_a_damaged_file_naming_it_and_how_far_it_was_read(tmp_path):
    from marin.curation.dedup_steps import exact_deduplicated

    folder = tmp_path / "docs"
    folder.mkdir()
    lines = "".join(json.dumps({"id": str(i), "text": f"{STORY} Story number {i}."}) + "\n" for i in range(400))
    whole = gzip.compress(lines.encode(), mtime=0)
    (folder / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    message = _failure(exact_deduplicated("curated/exact", str(folder), backend="inline"), tmp_path / "p")
    assert "cut.jsonl.gz: damaged input" in message and "documents before the damage" in message, message
    assert "curation step given on_damaged_input='skip'" in message and "Traceback" not in message


def test_a_truncated_jsonl_zst_is_reported_cut_short_and_skip_keeps_every_whole_document_before_the_cut(tmp_path):
    import zstandard

    folder = tmp_path / "docs"
    folder.mkdir()
    lines = "".join(json.dumps({"id": str(i), "text": f"{STORY} Story number {i}, told {i * 7919 % 10007} times."}) + "\n"
                    for i in range(3000))
    whole = zstandard.ZstdCompressor().compress(lines.encode())
    cut = whole[: len(whole) * 3 // 4]  # inside a frame of several blocks: the blocks before the cut can be read
    (folder / "cut.jsonl.zst").write_bytes(cut)
    readable = zstandard.ZstdDecompressor().decompressobj().decompress(cut).count(b"\n")
    assert 0 < readable < 3000
    message = _failure(quality_filtered("curated/quality", str(folder), backend="inline"), tmp_path / "p")
    assert "cut.jsonl.zst: damaged input: is cut short: its zstd data ends early" in message, message
    assert f"read {readable:,} documents before the damage" in message and "Traceback" not in message

    result = _run(quality_filtered("curated/quality", str(folder), backend="inline", on_damaged_input="skip"), tmp_path / "q")
    damaged = result.summary["damaged"]
    assert damaged["files"] == 1 and damaged["documents_read"] == readable == result.summary["documents_in"]
    assert "cut short" in damaged["by_file"][0]["problem"]


def test_a_lone_surrogate_escape_is_damage_naming_the_file_and_line_not_an_encoding_error(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    good = [json.dumps({"id": str(i), "text": f"{STORY} Story number {i}."}) for i in range(3)]
    broken = '{"id": "x", "text": "' + STORY + ' Half a character: \\ud800."}'
    (folder / "docs.jsonl").write_text("\n".join([good[0], broken, good[1], good[2]]) + "\n")
    message = _failure(quality_filtered("curated/quality", str(folder), backend="inline"), tmp_path / "p")
    assert "docs.jsonl: damaged input: line 2: holds a lone surrogate escape (\\ud800)" in message, message
    assert "UnicodeEncodeError" not in message and "Traceback" not in message

    result = _run(quality_filtered("curated/quality", str(folder), backend="inline", on_damaged_input="skip"), tmp_path / "q")
    damaged = result.summary["damaged"]
    assert damaged["files"] == 1 and damaged["documents_read"] == 1 == result.summary["documents_in"]
    assert "line 2: holds a lone surrogate" in damaged["by_file"][0]["problem"]
