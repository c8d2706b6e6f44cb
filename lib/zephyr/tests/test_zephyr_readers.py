import gzip
import json
import os
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zephyr.execute import execute
from zephyr.readers import (
    DocumentReader,
    HubDatasetUnavailableError,
    InputFileError,
    InputNotFoundError,
    UnsupportedInputError,
    documents_dataset,
    expand_input_files,
    looks_like_hub_dataset_id,
    read_documents,
    resolve_hub_dataset,
)
from zephyr.sinks import CollectSink


def _jsonl_bytes(texts, field="text"):
    return "".join(json.dumps({field: t}) + "\n" for t in texts).encode()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "a.jsonl").write_bytes(_jsonl_bytes(["one", "two"]) + b"\n")  # a trailing blank line is fine
    (root / "nested").mkdir()
    (root / "nested" / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl_bytes(["three"])))
    (root / "nested" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl_bytes(["four"])))
    pq.write_table(pa.table({"text": ["five", "six"], "n": [5, 6]}), root / "d.parquet")
    (root / "e.txt").write_text("a whole file\nis one document\n", encoding="utf-8")
    (root / ".hidden.jsonl").write_bytes(_jsonl_bytes(["hidden"]))
    (root / "notes.csv").write_text("ignored")
    return root


def test_directory_reads_every_format_in_sorted_order(corpus):
    files = expand_input_files(str(corpus))
    assert [os.path.relpath(f, corpus) for f in files] == [
        "a.jsonl", "d.parquet", "e.txt", "nested/b.jsonl.gz", "nested/c.jsonl.zst"]
    assert list(read_documents(str(corpus))) == [
        "one", "two", "five", "six", "a whole file\nis one document\n", "three", "four"]


def test_glob_list_and_field_name(corpus, tmp_path):
    assert list(read_documents(str(corpus / "nested" / "*.jsonl.*"))) == ["three", "four"]
    (tmp_path / "x.jsonl").write_bytes(_jsonl_bytes(["body"], field="content"))
    assert list(read_documents([str(tmp_path / "x.jsonl")], text_field="content")) == ["body"]


def test_text_split_on_separator(tmp_path):
    path = tmp_path / "stories.txt"
    path.write_text("Once upon a time.\n<|endoftext|>\nThe end.\n<|endoftext|>\n", encoding="utf-8")
    assert list(DocumentReader(separator="<|endoftext|>")(str(path))) == ["Once upon a time.", "The end."]


def test_shared_tinystories_sample_reads_fully(real_data):
    documents = list(read_documents(str(real_data.train)))
    assert len(documents) == 1800 and all(documents)


def test_documents_dataset_one_shard_per_file(corpus):
    ds = documents_dataset(str(corpus / "nested"))
    assert ds.num_source_shards == 2
    assert ds.collect(backend="inline") == ["three", "four"]


# -- bad input: a clear error naming the file (and line), or a counted skip -------------------------

def _bad_files(root):
    (root / "malformed.jsonl").write_bytes(_jsonl_bytes(["ok"]) + b'{"text": "unterminated\n' + _jsonl_bytes(["after"]))
    (root / "missing_field.jsonl").write_bytes(_jsonl_bytes(["ok"]) + b'{"body": "x"}\n')
    (root / "empty.jsonl").write_bytes(b"")
    (root / "binary.jsonl").write_bytes(b'{"text": "ok"}\n' + bytes(range(128, 256)) + b"\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    (root / "empty.parquet").write_bytes(b"")
    (root / "no_text.parquet").write_bytes(b"")
    pq.write_table(pa.table({"body": ["x"]}), root / "no_text.parquet")
    return root


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return _bad_files(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize(
    ("name", "message", "line", "counter"),
    [
        ("malformed.jsonl", "malformed JSON", 2, "skipped/malformed_json"),
        ("missing_field.jsonl", r"has no field 'text' \(fields: body\)", 2, "skipped/missing_field"),
        ("empty.jsonl", "is empty", None, "skipped/empty_file"),
        ("binary.jsonl", "is not UTF-8", 2, "skipped/not_utf8"),
        ("empty.txt", "is empty", None, "skipped/empty_file"),
        ("binary.txt", "is not UTF-8", 1, "skipped/not_utf8"),
        ("empty.parquet", "is empty", None, "skipped/empty_file"),
    ],
)
def test_bad_input_raises_naming_file_and_line_or_is_counted(bad, name, message, line, counter):
    path = str(bad / name)
    with pytest.raises(InputFileError, match=message) as caught:
        list(DocumentReader()(path))
    assert caught.value.path == path and caught.value.line == line
    assert path in str(caught.value) and (line is None or f"line {line}" in str(caught.value))

    result = execute(documents_dataset(path, on_error="skip"), CollectSink(), backend="inline")
    assert result.counters == {counter: 1}
    good = {"malformed.jsonl": ["ok", "after"], "missing_field.jsonl": ["ok"], "binary.jsonl": ["ok"]}
    assert result.outputs == [good.get(name, [])]


def test_missing_parquet_column_always_raises(bad):
    with pytest.raises(InputFileError, match="has no column 'text'"):
        list(DocumentReader(on_error="skip")(str(bad / "no_text.parquet")))


def test_nonexistent_paths_raise_even_when_skipping(tmp_path):
    for spec in [str(tmp_path / "nope.jsonl"), str(tmp_path / "*.jsonl")]:
        with pytest.raises(InputNotFoundError, match="nope.jsonl|\\*.jsonl"):
            list(read_documents(spec, on_error="skip"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputNotFoundError, match="holds no jsonl"):
        expand_input_files(str(tmp_path / "empty_dir"))
    with pytest.raises(FileNotFoundError):  # InputNotFoundError is also a FileNotFoundError
        list(DocumentReader()(str(tmp_path / "gone.jsonl")))


def test_errors_from_worker_processes_keep_file_and_line(bad):
    from fray.cluster import LocalClient

    with pytest.raises(InputFileError) as caught:
        documents_dataset(str(bad / "malformed.jsonl")).collect(backend=LocalClient(processes=True, max_workers=1))
    assert caught.value.line == 2 and caught.value.path.endswith("malformed.jsonl")
    assert "raised in shard 0" in "".join(caught.value.__notes__)


def test_unsupported_extension_and_bad_on_error(tmp_path):
    (tmp_path / "data.csv").write_text("a,b")
    with pytest.raises(UnsupportedInputError, match="data.csv"):
        list(read_documents(str(tmp_path / "data.csv")))
    with pytest.raises(ValueError, match="on_error"):
        list(DocumentReader(on_error="ignore")(str(tmp_path / "data.csv")))


# -- Hugging Face dataset ids ------------------------------------------------------------------------

def test_hub_dataset_from_local_cache_and_uncached_error(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "datasets--someone--stories"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit / "data"
    snapshot.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["t1", "t2"]}), snapshot / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": ["v1"]}), snapshot / "validation-00000-of-00001.parquet")
    (snapshot.parent / "README.md").write_text("# card")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    assert looks_like_hub_dataset_id("someone/stories") and not looks_like_hub_dataset_id(str(tmp_path))
    resolved = resolve_hub_dataset("someone/stories")
    assert resolved.revision == commit and sorted(resolved.splits) == ["train", "validation"]
    assert list(read_documents(resolved.files("train"))) == ["t1", "t2"]
    assert list(read_documents(resolved.files("validation"))) == ["v1"]
    with pytest.raises(HubDatasetUnavailableError, match="'someone/absent' is not in the local cache"):
        resolve_hub_dataset("someone/absent")


def test_corrupt_compressed_file_names_the_file(tmp_path):
    for name, data in [("broken.jsonl.gz", gzip.compress(_jsonl_bytes(["x" * 100]))[:-20]),
                       ("broken.jsonl.zst", b"not zstd at all"), ("broken.txt.gz", b"\x1f\x8b garbage")]:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(InputFileError, match=name):
            list(DocumentReader()(str(path)))


def test_field_reader_names_each_record_it_yields(tmp_path):
    from zephyr.readers import FieldReader

    (tmp_path / "a.jsonl").write_text('{"messages": [1]}\n\n{"messages": [2, 3]}\n{"other": 1}\n')
    pq.write_table(pa.table({"messages": [[4], [5]]}), tmp_path / "b.parquet")
    reader = FieldReader("messages")
    jsonl = str(tmp_path / "a.jsonl")
    with pytest.raises(InputFileError, match=r"a.jsonl, line 4: has no field 'messages' \(fields: other\)"):
        list(reader(jsonl))
    assert list(FieldReader("messages", on_error="skip")(jsonl)) == [(f"{jsonl}, line 1", [1]), (f"{jsonl}, line 3", [2, 3])]
    parquet = str(tmp_path / "b.parquet")
    assert list(reader(parquet)) == [(f"{parquet}, row 1", [4]), (f"{parquet}, row 2", [5])]
    (tmp_path / "c.txt").write_text("text")
    with pytest.raises(InputFileError, match="is a text file"):
        list(reader(str(tmp_path / "c.txt")))


def test_documents_a_curation_step_marked_not_kept_are_skipped(tmp_path):
    import json

    from zephyr.readers import DocumentReader

    path = tmp_path / "marked.jsonl"
    records = [{"text": "first", "kept": True}, {"text": "duplicate", "kept": False, "reason": "exact-duplicate"},
               {"text": "plain"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert list(DocumentReader()(str(path))) == ["first", "plain"]
    # The same in Parquet (a null "kept" counts as kept), and a file without the column reads every row.
    import pyarrow as pa
    import pyarrow.parquet as pq

    marked = tmp_path / "marked.parquet"
    pq.write_table(pa.Table.from_pylist(records), marked)
    assert list(DocumentReader()(str(marked))) == ["first", "plain"]
    unmarked = tmp_path / "unmarked.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "a"}, {"text": "b"}]), unmarked)
    assert list(DocumentReader()(str(unmarked))) == ["a", "b"]


def test_jsonl_lines_read_as_the_standard_library_reads_them(tmp_path):
    # Records are Python's json values exactly, also where a faster parser would differ: orjson, for one,
    # turns integers past 64 bits into floats and refuses NaN. (A lone surrogate escape is refused: it is not text.)
    from zephyr.readers import read_jsonl

    lines = ['{"text": "caf\\u00e9 \\ud83d\\ude00 \\u4e2d", "score": 1.5e-7}', '{"text": "x", "score": NaN}',
             '{"text": "big", "id": 123456789012345678901234567890}',
             '{"text": "tab\\tand quote \\" and slash \\/"}', '{"text": "Grüße aus Köln", "n": -0.0}']
    path = tmp_path / "mixed.jsonl"
    path.write_bytes("\r\n".join(lines).encode("utf-8") + b"\r\n")
    got = list(read_jsonl(str(path)))
    want = [json.loads(line) for line in lines]
    assert repr(got) == repr(want)  # repr: NaN != NaN, and -0.0 == 0.0 would hide a lost sign


# -- compressed files cut short, and strings that are not text ---------------------------------------

def _cut_zstd(tmp_path, name, data):
    """``data`` compressed in several zstd blocks and cut inside the last-but-one: what can still be decompressed."""
    whole = zstandard.ZstdCompressor().compress(data)
    cut = whole[: len(whole) * 3 // 4]
    (tmp_path / name).write_bytes(cut)
    return zstandard.ZstdDecompressor().decompressobj().decompress(cut)  # every byte before the damage


def test_a_zstd_file_cut_short_is_refused_as_cut_short_after_every_whole_line_before_it(tmp_path):
    texts = [f"story {i}: " + " ".join(f"w{(i * 7919 + j) % 10007}" for j in range(30)) for i in range(3000)]
    readable = _cut_zstd(tmp_path, "cut.jsonl.zst", _jsonl_bytes(texts))
    whole_lines = readable.count(b"\n")
    assert 0 < whole_lines < len(texts)  # the cut leaves whole blocks before it, and a partial line
    path = str(tmp_path / "cut.jsonl.zst")
    read = []
    with pytest.raises(InputFileError) as caught:
        for text in DocumentReader()(path):
            read.append(text)
    assert read == texts[:whole_lines]
    assert caught.value.path == path and caught.value.line is None
    whole_bytes = readable.rindex(b"\n") + 1
    assert f"is cut short: its zstd data ends early, after {whole_bytes:,} decompressed bytes" in str(caught.value)

    _cut_zstd(tmp_path, "cut.txt.zst", "\n".join(texts).encode())  # was read as a shorter document
    with pytest.raises(InputFileError, match="cut.txt.zst: is cut short: its zstd data ends early"):
        list(DocumentReader()(str(tmp_path / "cut.txt.zst")))


def test_a_gzip_file_cut_short_says_so_and_how_much_was_decompressed(tmp_path):
    data = _jsonl_bytes([f"story {i} " * 20 for i in range(2000)])
    whole = gzip.compress(data)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    readable = zlib.decompressobj(wbits=31).decompress(whole[: len(whole) // 2])
    whole_bytes = readable.rindex(b"\n") + 1
    with pytest.raises(InputFileError, match=f"cut.jsonl.gz: is cut short: its gzip data ends early, after "
                                             f"{whole_bytes:,} decompressed bytes"):
        list(DocumentReader()(str(tmp_path / "cut.jsonl.gz")))


def test_several_zstd_frames_are_read_whole_and_a_frame_cut_short_is_refused(tmp_path):
    frames = [zstandard.ZstdCompressor().compress(_jsonl_bytes([text])) for text in ("one", "two", "three")]
    (tmp_path / "frames.jsonl.zst").write_bytes(b"".join(frames))
    assert list(DocumentReader()(str(tmp_path / "frames.jsonl.zst"))) == ["one", "two", "three"]
    (tmp_path / "cut.jsonl.zst").write_bytes(b"".join(frames)[:-3])
    read = []
    with pytest.raises(InputFileError, match="is cut short"):
        for text in DocumentReader()(str(tmp_path / "cut.jsonl.zst")):
            read.append(text)
    assert read == ["one", "two"]


def test_a_lone_surrogate_escape_is_refused_naming_the_file_and_line_or_skipped_and_counted(tmp_path):
    path = tmp_path / "surrogate.jsonl"
    # an escaped pair is one character, and an escaped backslash before "ud800" is text: both are fine
    path.write_bytes(b'{"text": "pair \\ud83d\\ude00"}\n{"text": "a\\ud800b"}\n{"text": "not \\\\ud800 an escape"}\n'
                     b'{"text": "ok", "meta": {"k": ["\\uDC00"]}}\n')
    with pytest.raises(InputFileError) as caught:
        list(DocumentReader()(str(path)))
    assert caught.value.path == str(path) and caught.value.line == 2
    assert "lone surrogate" in str(caught.value) and "\\ud800" in str(caught.value)

    result = execute(documents_dataset(str(path), on_error="skip"), CollectSink(), backend="inline")
    assert result.outputs == [["pair \U0001f600", "not \\ud800 an escape"]]
    assert result.counters == {"skipped/lone_surrogate": 2}
