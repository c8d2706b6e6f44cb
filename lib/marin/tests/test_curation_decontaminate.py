"""Decontamination: planted leaks of evaluation items are all removed, clean documents all kept."""

from __future__ import annotations

import json
from pathlib import Path

from marin.curation.decontaminate import decontaminated
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lower
from marin.execution.step_runner import StepRunner
from storygen import generate_stories


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def run(handle, prefix: Path) -> CuratedDataset:
    runner = StepRunner(prefix=str(prefix))
    runner.run([handle])
    return load_artifact(runner.output_path_for(lower(handle)[-1]), CuratedDataset).result


EVAL = [
    {"question": "What is the boiling point of water at sea level in degrees Celsius, measured under standard pressure?", "answer": "100"},
    {"question": "Which planet in our solar system is known as the red planet because of the iron oxide on its surface?", "answer": "Mars"},
    {"question": "Name the author who wrote the long novel about a whale hunt told by a sailor called Ishmael.", "answer": "Melville"},
]
SHORT_EVAL = "The quick brown fox jumps over the lazy dog today."  # 10 words: indexed whole


def _inputs(tmp_path: Path) -> tuple[str, list[str], list[str]]:
    stories = generate_stories(40, seed=5)
    leaks = {
        "leak-0": stories[0] + " " + EVAL[0]["question"].upper(),  # case changed
        "leak-1": stories[1] + "\n" + EVAL[1]["question"].replace(" ", "  ").replace(",", ""),  # spacing and punctuation
        "leak-1b": "Quiz: " + " ".join(EVAL[1]["question"].split()[2:15]) + " and more.",  # a 13-word slice only
        "leak-short": stories[2] + " " + SHORT_EVAL,
    }
    clean = {f"clean-{i}": s for i, s in enumerate(stories[3:])}
    records = [{"id": k, "text": v} for k, v in {**clean, **leaks}.items()]
    write_jsonl(tmp_path / "train" / "a.jsonl", records[::2])
    write_jsonl(tmp_path / "train" / "b.jsonl", records[1::2])
    write_jsonl(tmp_path / "eval" / "qa.jsonl", EVAL)
    (tmp_path / "eval" / "short.txt").write_text(SHORT_EVAL)
    return str(tmp_path / "train"), sorted(leaks), sorted(clean)


def test_planted_leaks_are_removed_and_clean_documents_kept(tmp_path):
    train, leaks, clean = _inputs(tmp_path)
    handle = decontaminated("curated/decontaminated", train, [str(tmp_path / "eval" / "qa.jsonl"), str(tmp_path / "eval" / "short.txt")],
                            eval_text_fields=("question", "answer"), backend="inline")
    result = run(handle, tmp_path / "p")
    kept = read_curated(result.files)
    removed = {r["id"]: r for r in read_curated(result.removed_files)}
    assert sorted(removed) == leaks and sorted(r["id"] for r in kept) == clean
    assert removed["leak-0"]["contamination"] == ["qa.jsonl:1"]
    assert removed["leak-1"]["contamination"] == removed["leak-1b"]["contamination"] == ["qa.jsonl:2"]
    assert removed["leak-short"]["contamination"] == ["short.txt:1"]
    assert all(r["reason"] == "decontaminate" for r in removed.values())
    assert result.summary["hits"] == {"qa.jsonl:1": 1, "qa.jsonl:2": 2, "short.txt:1": 1}
    assert result.summary["removed"]["decontaminate"]["documents"] == 4 and result.summary["documents_out"] == 37


def test_mark_mode_flags_without_removing(tmp_path):
    train, _, _ = _inputs(tmp_path)
    result = run(decontaminated("curated/marked", train, str(tmp_path / "eval" / "qa.jsonl"), eval_text_fields=("question",),
                                mode="mark", backend="inline"), tmp_path / "p")
    records = read_curated(result.files)
    assert len(records) == 41 and result.removed_files == []
    assert sorted(r["id"] for r in records if r["contamination"]) == ["leak-0", "leak-1", "leak-1b"]
    assert result.summary["marked"]["decontaminate"]["documents"] == 3
