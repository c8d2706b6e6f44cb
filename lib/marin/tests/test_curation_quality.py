"""Quality heuristics: each Gopher and C4 rule named when it removes, identical bytes on every backend, cached reruns."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from marin.curation.quality import C4, GOPHER, C4Rules, GopherRules, QualityRules, quality_filtered
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lower
from marin.execution.step_runner import StepRunner
from storygen import generate_stories


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def run(handle, prefix: Path) -> tuple[CuratedDataset, str]:
    runner = StepRunner(prefix=str(prefix))
    runner.run([handle])
    out = runner.output_path_for(lower(handle)[-1])
    return load_artifact(out, CuratedDataset).result, out


STORIES = generate_stories(6, seed=11)
PROSE = " ".join(STORIES[:2])


@pytest.mark.parametrize(("text", "rule"), [
    ("A short line of text that is fine.", "gopher_word_count"),
    (" ".join(["Extraordinarily incomprehensible characteristics notwithstanding."] * 15), "gopher_mean_word_length"),
    (PROSE + " " + "# " * 80, "gopher_symbol_word_ratio"),
    ("\n".join(f"- item {i} of the list and the rest" for i in range(60)), "gopher_bullet_lines"),
    ("\n".join(f"the story of day {i} went on and on with..." for i in range(60)), "gopher_ellipsis_lines"),
    (PROSE + " " + " ".join(["1234"] * 200), "gopher_alpha_words"),
    (" ".join(f"cat{i} dog{i} bird{i}." for i in range(40)), "gopher_stop_words"),
    ("\n".join([STORIES[0].split(". ")[0] + "."] * 5 + STORIES[1].split(". ")[:5]), "gopher_duplicate_lines"),
])
def test_each_gopher_rule_names_itself(text, rule):
    assert rule in GOPHER.failures(text)
    assert GOPHER.failures(PROSE) == []


def test_repetition_rules_catch_repeated_ngrams():
    failed = GOPHER.failures(" ".join([STORIES[0][:200]] * 6))
    assert "gopher_duplicate_10gram_chars" in failed and "gopher_top_2gram_chars" not in failed
    assert "gopher_top_2gram_chars" in GOPHER.failures(PROSE + " " + "click here " * 60)


def test_c4_cleans_the_text_gopher_then_reads():
    page = "\n".join([
        "Home | About | Contact",
        "Please enable JavaScript to view the comments powered by us.",
        "This site uses cookies to improve your experience, we promise.",
        "function f() { return 1; }",  # no end mark: dropped before the curly bracket rule sees it
        "Too short.",
        *STORIES[0].split("\n"),
    ])
    verdict = QualityRules()({"text": page})
    assert verdict.kept and verdict.attributes["c4_lines_dropped"] == 5
    assert verdict.attributes["text"] == C4.clean(STORIES[0])[0]
    assert QualityRules()({"text": PROSE + "\nWrite the set as {1, 2, 3} in your notes."}).reason == "c4_curly_brace"
    unchanged = QualityRules(rewrite=False)({"text": page})
    assert "text" not in unchanged.attributes and unchanged.attributes["c4_lines_dropped"] == 5


def test_the_identity_covers_what_the_rules_measure(tmp_path):
    """Outputs made under an earlier definition of a rule set are not reused: its definition is hashed."""
    source = _inputs(tmp_path / "in")
    current = quality_filtered("curated/quality", source)
    for rules in (GopherRules(), C4Rules()):
        object.__setattr__(rules, "definition", rules.definition - 1)
        older = quality_filtered("curated/quality", source, **{"gopher" if isinstance(rules, GopherRules) else "c4": rules})
        assert older.identity != current.identity
    assert quality_filtered("curated/quality", source, gopher=GopherRules()).identity == current.identity


def test_rules_are_configurable():
    lenient = replace(GOPHER, min_words=3)
    assert "gopher_word_count" not in lenient.failures("The cat and the dog sat.")
    assert QualityRules(gopher=lenient, c4=None)({"text": "The cat and the dog sat."}).kept


def _inputs(folder: Path) -> str:
    good = [{"id": f"good-{i}", "text": s} for i, s in enumerate(STORIES)]
    bad = [{"id": "spam", "text": "buy now click here " * 30}, {"id": "lorem", "text": PROSE + "\nLorem ipsum dolor sit amet."},
           {"id": "short", "text": "Just a tiny note."}]
    write_jsonl(folder / "a.jsonl", good[:3] + bad[:2])
    write_jsonl(folder / "b.jsonl", good[3:] + bad[2:])
    return str(folder)


def test_step_explains_every_removal_and_summarises(tmp_path):
    result, _ = run(quality_filtered("curated/quality", _inputs(tmp_path / "in"), backend="inline"), tmp_path / "p")
    kept = read_curated(result.files)
    removed = {r["id"]: r for r in read_curated(result.removed_files)}
    assert sorted(r["id"] for r in kept) == [f"good-{i}" for i in range(6)]
    assert {i: r["reason"] for i, r in removed.items()} == {
        "spam": "c4_too_few_sentences", "lorem": "c4_lorem_ipsum", "short": "c4_too_few_sentences"}
    assert "gopher_word_count" in removed["short"]["failed_rules"]
    summary = result.summary
    assert (summary["documents_in"], summary["documents_out"]) == (9, 6)
    assert summary["removed"]["c4_too_few_sentences"]["documents"] == 2
    assert summary["bytes_out"] == sum(len(r["text"].encode()) for r in kept)


def test_mark_mode_keeps_every_document_with_its_verdict(tmp_path):
    result, _ = run(quality_filtered("curated/quality-marked", _inputs(tmp_path / "in"), mode="mark", backend="inline"), tmp_path / "p")
    records = read_curated(result.files)
    assert len(records) == 9 and read_curated(result.removed_files) == []
    assert sorted(r["id"] for r in records if not r["kept"]) == ["lorem", "short", "spam"]
    assert result.summary["marked"]["c4_lorem_ipsum"]["documents"] == 1 and result.summary["removed"] == {}


def test_processes_write_the_same_bytes_as_inline_and_a_rerun_is_cached(tmp_path):
    source = _inputs(tmp_path / "in")
    outputs = {}
    for backend in ("inline", "processes"):
        runner = StepRunner(prefix=str(tmp_path / backend))
        handle = quality_filtered("curated/quality", source, backend=backend)
        runner.run([handle])
        root = Path(runner.output_path_for(handle))
        outputs[backend] = {str(p.relative_to(root)): p.read_bytes() for sub in ("data", "removed", "stats")
                            for p in sorted((root / sub).glob("*"))}
    assert len(outputs["inline"]) == 6 and outputs["inline"] == outputs["processes"]
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "inline").rglob("part-*")}
    StepRunner(prefix=str(tmp_path / "inline")).run([quality_filtered("curated/quality", source, backend="inline")])
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "inline").rglob("part-*")} == stamp


def test_a_step_reads_another_steps_output(tmp_path):
    first = quality_filtered("curated/quality", _inputs(tmp_path / "in"), backend="inline")
    second = quality_filtered("curated/quality-again", first, gopher=None, backend="inline")
    result, _ = run(second, tmp_path / "p")
    assert result.summary["documents_in"] == 6 and result.summary["documents_out"] == 6
