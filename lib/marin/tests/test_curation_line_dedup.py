"""Line dedup on generated stories with a planted header and footer shared by every document."""

import json
from pathlib import Path

import pytest
import zstandard
from marin.curation.dedup_steps import LineDedupConfig, line_deduplicated
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from storygen import generate_stories

HEADER = "Visit our site for more stories every day!"
FOOTER = "Thanks for reading, and sleep well tonight."
SHORT = "The end."  # in every document, but shorter than min_chars
REPEATED = "This line is repeated twice in a single story."  # in one document only


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(folder, stories by id): each document is header, story, short line, footer; doc-0007 repeats a line."""
    stories = {f"doc-{i:04d}": story for i, story in enumerate(generate_stories(30, seed=3))}
    stories["doc-0007"] = f"{REPEATED}\n{stories['doc-0007']}\n{REPEATED}"
    folder = tmp_path_factory.mktemp("corpus") / "docs"
    folder.mkdir()
    ids = sorted(stories, reverse=True)  # input order differs from id order
    for f in range(3):
        with open(folder / f"shard-{f}.jsonl", "w") as handle:
            handle.writelines(json.dumps({"id": i, "text": f"  {HEADER}\n{stories[i]}\n{SHORT}\n{FOOTER}\n"}) + "\n"
                              for i in ids[f::3])
    # A document of nothing but boilerplate is left empty.
    with open(folder / "shard-2.jsonl", "a") as handle:
        handle.write(json.dumps({"id": "zz-only-boilerplate", "text": f"{HEADER}\n{FOOTER}"}) + "\n")
    return folder, stories


def read_records(files) -> dict[str, dict]:
    out = {}
    for path in files:
        with open(path, "rb") as handle:
            data = zstandard.ZstdDecompressor().stream_reader(handle).read().decode()
        out.update((r["id"], r) for r in map(json.loads, data.splitlines()) if r)
    return out


def run_step(step, prefix):
    runner = StepRunner(prefix=str(prefix))
    runner.run([step])
    return runner, load_artifact(runner.output_path_for(step)).result


def test_shared_lines_stay_only_in_the_first_document(corpus, tmp_path):
    folder, stories = corpus
    _, result = run_step(line_deduplicated("dedup/lines", folder, backend="inline"), tmp_path)
    records = read_records(result["files"] + result["removed_files"])
    assert len(records) == 31 and list(read_records(result["removed_files"])) == ["zz-only-boilerplate"]
    first = records["doc-0000"]
    assert first["kept"] and first["reason"] is None and first["lines_removed"] == 0
    assert first["text"] == f"  {HEADER}\n{stories['doc-0000']}\n{SHORT}\n{FOOTER}\n"
    for doc_id, story in stories.items():
        if doc_id == "doc-0000":
            continue
        record = records[doc_id]
        # Header and footer cut; the story (even a line it repeats itself), short line and trailing newline untouched.
        assert record["text"] == f"{story}\n{SHORT}\n", doc_id
        assert record["kept"] and record["lines_removed"] == 2 and record["reason"] is None
    empty = records["zz-only-boilerplate"]
    assert empty["kept"] is False and empty["reason"] == "all-lines-duplicated" and empty["text"] == ""
    summary = result["summary"]
    assert summary["documents_in"] == 31 and summary["documents_out"] == 30
    # 29 stories lost header and footer (the first keeps them); the boilerplate-only document lost both too.
    assert result["details"] == {"lines_removed": 60, "boilerplate_lines": 2, "documents_with_lines_removed": 30}
    assert {reason: bucket["documents"] for reason, bucket in summary["removed"].items()} == {"all-lines-duplicated": 1}
    cut = sum(len(f"  {HEADER}\n{FOOTER}\n".encode()) for _ in range(29))
    assert summary["bytes_in"] - summary["bytes_out"] == cut + len(f"{HEADER}\n{FOOTER}".encode())


def test_keep_first_false_cuts_shared_lines_everywhere(corpus, tmp_path):
    folder, stories = corpus
    step = line_deduplicated("dedup/lines", folder, config=LineDedupConfig(keep_first=False), backend="inline")
    _, result = run_step(step, tmp_path)
    records = read_records(result["files"])
    for doc_id, story in stories.items():
        assert records[doc_id]["text"] == f"{story}\n{SHORT}\n", doc_id
    assert result["details"]["lines_removed"] == 62


def test_lower_min_chars_reaches_short_lines(corpus, tmp_path):
    folder, stories = corpus
    step = line_deduplicated("dedup/lines", folder, config=LineDedupConfig(min_chars=1), backend="inline")
    _, result = run_step(step, tmp_path)
    records = read_records(result["files"])
    assert records["doc-0001"]["text"] == f"{stories['doc-0001']}\n"
    assert records["doc-0001"]["lines_removed"] == 3


def tree_bytes(folder: str) -> dict[str, bytes]:
    """The step's output files (data/, removed/, stats/), without the runner's own records (dot files, and the attempts' logs in .attempts/)."""
    root = Path(folder)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def test_outputs_are_identical_across_backends_and_reruns_are_cached(corpus, tmp_path):
    folder, _ = corpus
    outputs = []
    for backend in ("inline", "processes"):
        runner = StepRunner(prefix=str(tmp_path / backend))
        step = line_deduplicated("dedup/lines", folder, num_shards=2, backend=backend)
        assert runner.run([step]).ran == ["dedup/lines"]
        outputs.append(tree_bytes(runner.output_path_for(step)))
    assert outputs[0] == outputs[1] and outputs[0]
    assert runner.run([step]).ran == []
    report = runner.run([line_deduplicated("dedup/lines", folder, config=LineDedupConfig(min_documents=40),
                                           backend="processes")])
    assert report.ran == ["dedup/lines"]


def test_mark_mode_keeps_the_emptied_document_in_data_marked_not_kept(corpus, tmp_path):
    folder, _ = corpus
    _, result = run_step(line_deduplicated("dedup/lines", folder, mode="mark", backend="inline"), tmp_path)
    records = read_records(result["files"])
    assert len(records) == 31 and result["removed_files"] == []
    assert records["zz-only-boilerplate"]["kept"] is False
    assert result["summary"]["marked"]["all-lines-duplicated"]["documents"] == 1
    assert result["summary"]["removed"] == {}
