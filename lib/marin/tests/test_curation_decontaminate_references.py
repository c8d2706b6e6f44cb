"""Decontamination against the built-in evaluation tasks by name and against token caches.

Each kind of reference removes the document that holds one of its texts verbatim and keeps the one
that does not, and is part of the step's identity.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer

from marin.curation import reference_tasks
from marin.curation.decontaminate import decontaminated
from marin.curation.steps import CuratedDataset, CurationError, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.records.run_report import StepRunFailed
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from storygen import generate_stories


def write_jsonl(path: Path, texts) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": key, "text": text}) + "\n" for key, text in texts.items()), encoding="utf-8")
    return path


def run(runner: StepRunner, handle) -> CuratedDataset:
    runner.run([handle])
    return load_artifact(runner.output_path_for(handle), CuratedDataset).result


def outcome(result: CuratedDataset) -> tuple[list[str], dict[str, list[str]]]:
    """(kept ids, removed id -> the evaluation items it matched)."""
    return (sorted(r["id"] for r in read_curated(result.files)),
            {r["id"]: r["contamination"] for r in read_curated(result.removed_files)})


# -- built-in evaluation tasks -----------------------------------------------------------------------

# Story 3's frog is the task's document 29 (8 objects per story, the frog 6th); story 100 is the
# rule as the task's own training text states it, with a story number no test item uses.
TASK_LEAK = "Quiz time. In story 3, the frog was green. Who knew?"
TASK_RULE = "In story 100, the frog was green."


def test_a_builtin_task_removes_the_document_holding_its_text(tmp_path):
    pytest.importorskip("lm_eval", reason="the built-in tasks are read through lm-eval-harness (the test extra)")
    stories = generate_stories(3, seed=4)
    write_jsonl(tmp_path / "train" / "docs.jsonl", {"leak": stories[0] + " " + TASK_LEAK, "rule": stories[1] + " " + TASK_RULE,
                                                    "story": stories[2]})
    # Every item of this task has 7 words ("in story 3 the frog was green"): matched whole from 7.
    handle = decontaminated("curated/no-task", str(tmp_path / "train"), eval_tasks=["marin_object_colours"], min_words=7,
                            backend="inline")
    kept, removed = outcome(run(StepRunner(prefix=str(tmp_path / "p")), handle))
    assert kept == ["rule", "story"] and removed == {"leak": ["marin_object_colours:29"]}


def test_a_task_too_short_for_min_words_is_refused_rather_than_checking_nothing(tmp_path):
    pytest.importorskip("lm_eval", reason="the built-in tasks are read through lm-eval-harness (the test extra)")
    write_jsonl(tmp_path / "train" / "docs.jsonl", {"leak": TASK_LEAK})
    handle = decontaminated("curated/no-task", str(tmp_path / "train"), eval_tasks=["marin_object_colours"], backend="inline")
    runner = StepRunner(prefix=str(tmp_path / "p"))
    with pytest.raises(StepRunFailed, match=r"CurationError: task 'marin_object_colours': none of its 48 items has min_words=8 words "
                                            r"\(the longest has 7\)"):
        runner.run([handle])


def test_an_unknown_task_name_is_one_line_naming_the_known_ones(tmp_path):
    with pytest.raises(CurationError) as raised:
        decontaminated("curated/x", str(tmp_path), eval_tasks=["marin_object_colors"])
    message = str(raised.value)
    assert "\n" not in message
    assert message == ("unknown evaluation task 'marin_object_colors': the built-in tasks are marin_object_colours. "
                       "Did you mean 'marin_object_colours'?")
    with pytest.raises(CurationError, match=r"unknown evaluation task 'hellaswag': the built-in tasks are marin_object_colours\.$"):
        decontaminated("curated/x", str(tmp_path), eval_tasks=["hellaswag"])


def test_a_step_needs_some_reference(tmp_path):
    with pytest.raises(CurationError, match="eval_sets, eval_tasks or eval_caches"):
        decontaminated("curated/x", str(tmp_path))


def test_editing_a_task_changes_the_step_identity(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval", reason="the built-in tasks are read through lm-eval-harness (the test extra)")
    original = Path(reference_tasks.builtin_task("marin_object_colours").config_file).parent
    copy = tmp_path / "tasks" / original.name
    shutil.copytree(original, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(reference_tasks, "tasks_dir", lambda: str(tmp_path / "tasks"))
    reference_tasks.builtin_tasks.cache_clear()
    try:
        train = write_jsonl(tmp_path / "train" / "docs.jsonl", {"story": "Once upon a time."})

        def identity() -> str:
            return decontaminated("curated/no-task", str(train), eval_tasks=["marin_object_colours"]).identity

        before = identity()
        assert identity() == before
        data = copy / "object_colours.jsonl"
        data.write_text(data.read_text().replace("story 0,", "story 9,", 1))
        edited = identity()
        config = copy / "object_colours.yaml"
        config.write_text(config.read_text().replace("version: 1.0", "version: 2.0"))
        assert len({before, edited, identity()}) == 3
    finally:
        reference_tasks.builtin_tasks.cache_clear()


# -- token caches ------------------------------------------------------------------------------------

CACHE_TEXTS = {
    "q1": "Which river flows through the ancient city that the legends say was founded by two brothers raised by a wolf?",
    "q2": "A train leaves the station at noon travelling sixty miles an hour; how far has it gone by a quarter past three?",
}


def _cache_inputs(tmp_path: Path, gpt2: Path) -> tuple[StepRunner, object, Path]:
    runner = StepRunner(prefix=str(tmp_path / "p"))
    tokens = tokenized("tokenized/eval-questions", str(write_jsonl(tmp_path / "eval" / "questions.jsonl", CACHE_TEXTS)),
                       tokenizer=str(gpt2), backend="inline")
    stories = generate_stories(2, seed=8)
    # The leak changes case and punctuation: the decoded cache text is normalised like any other.
    train = write_jsonl(tmp_path / "train" / "docs.jsonl", {"leak": stories[0] + " " + CACHE_TEXTS["q2"].upper().replace(";", ""),
                                                            "story": stories[1]})
    return runner, tokens, train


@pytest.fixture
def gpt2(real_data) -> Path:
    """The real GPT-2 tokenizer's folder (the test skips, saying how to provide it, when absent)."""
    return real_data.gpt2


def test_a_tokenize_step_removes_the_document_holding_a_decoded_text(tmp_path, gpt2):
    runner, tokens, train = _cache_inputs(tmp_path, gpt2)
    handle = decontaminated("curated/no-cache", str(train), eval_caches=[tokens], backend="inline")
    kept, removed = outcome(run(runner, handle))
    assert kept == ["story"] and removed == {"leak": ["tokenized/eval-questions/train:1"]}


def test_a_cache_folder_is_decoded_with_the_tokenizer_its_step_recorded(tmp_path, gpt2):
    runner, tokens, train = _cache_inputs(tmp_path, gpt2)
    runner.run([tokens])
    folder = runner.output_path_for(tokens)
    handle = decontaminated("curated/no-cache", str(train), eval_caches=[folder], backend="inline")
    kept, removed = outcome(run(runner, handle))
    name = folder.rstrip("/").rsplit("/", 1)[-1]
    assert kept == ["story"] and removed == {"leak": [f"{name}/train:1"]}

    # Copied without the step's record, the caches need their tokenizer given; the identity is the content's.
    copy = tmp_path / "copied" / name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(".artifact.json"))
    with pytest.raises(StepRunFailed, match="CurationError: token cache .* its tokenizer was not found"):
        runner.run([decontaminated("curated/no-copy", str(train), eval_caches=[str(copy)], backend="inline")])
    paired = decontaminated("curated/no-cache", str(train), eval_caches=[(str(copy), str(gpt2))], backend="inline")
    assert paired.identity == handle.identity
    kept, removed = outcome(run(StepRunner(prefix=str(tmp_path / "q")), paired))
    assert kept == ["story"] and removed == {"leak": [f"{name}/train:1"]}

    # Ids are never decoded with a vocabulary other than the one the ledger records.
    save_tokenizer(train_bpe_tokenizer(generate_stories(5, seed=1), 300), str(tmp_path / "other-tokenizer"))
    other = decontaminated("curated/no-other", str(train), eval_caches=[(str(copy), str(tmp_path / "other-tokenizer"))],
                           backend="inline")
    with pytest.raises(StepRunFailed, match=r"CurationError: token cache .* was written by tokenizer sha256:.*decode it with "
                                            r"the tokenizer that wrote it"):
        runner.run([other])


def test_a_cache_with_other_content_gives_another_identity(tmp_path, gpt2):
    runner, tokens, train = _cache_inputs(tmp_path, gpt2)
    other = tokenized("tokenized/eval-questions", str(write_jsonl(tmp_path / "eval2" / "questions.jsonl", {"q": "Another question."})),
                      tokenizer=str(gpt2), backend="inline")
    runner.run([tokens, other])
    identities = set()
    for step in (tokens, other):
        copy = tmp_path / "copies" / step.identity / "cache"  # same name, other content
        shutil.copytree(runner.output_path_for(step), copy)
        identities.add(decontaminated("curated/x", str(train), eval_caches=[(str(copy), str(gpt2))]).identity)
    assert len(identities) == 2
