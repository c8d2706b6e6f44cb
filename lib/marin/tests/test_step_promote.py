"""A commit moves the staged output into the step folder entry by entry: what is there under the
same name is replaced (a file or a folder, empty or not), temporaries stay behind, and moving again
after a move cut short finishes it."""

from __future__ import annotations

from pathlib import Path

from marin.execution.ownership.step_ownership import promote, stage_unstaged_output


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_promote_replaces_same_named_entries_and_leaves_temporaries(tmp_path):
    step = tmp_path / "step"
    staged = step / ".staging-g2"
    (staged / "model").mkdir(parents=True)
    (staged / "model" / "weights.bin").write_text("new weights")
    (staged / "metrics.json").write_text("new metrics")
    (staged / "was_a_folder").write_text("now a file")
    (staged / "was_a_file").mkdir()
    (staged / "was_a_file" / "inside.txt").write_text("now a folder")
    (staged / ".x.tmp-0123456789ab").write_text("a killed writer's")
    (step / "model").mkdir()
    (step / "model" / "old.bin").write_text("old weights")  # a folder that is not empty
    (step / "metrics.json").write_text("old metrics")
    (step / "was_a_folder").mkdir()
    (step / "was_a_folder" / "old.txt").write_text("old")
    (step / "was_a_file").write_text("old")

    promote(str(step), ".staging-g2")

    assert _tree(step) == {"metrics.json": "new metrics", "model/weights.bin": "new weights",
                           "was_a_file/inside.txt": "now a folder", "was_a_folder": "now a file",
                           ".staging-g2/.x.tmp-0123456789ab": "a killed writer's"}  # not moved: not output
    promote(str(step), ".staging-g2")  # again, as anyone finishing a commit cut short would: nothing changes
    assert _tree(step)["model/weights.bin"] == "new weights"


def test_output_left_in_the_step_folder_moves_into_a_staging_folder_that_is_made(tmp_path):
    step = tmp_path / "step"
    (step / "checkpoints").mkdir(parents=True)
    (step / "checkpoints" / "step-10").write_text("state")
    (step / ".executor_status").write_text("{}")

    assert stage_unstaged_output(str(step), ".staging-g3") == ["checkpoints"]
    assert _tree(step / ".staging-g3") == {"checkpoints/step-10": "state"}
    assert (step / ".executor_status").exists() and not (step / "checkpoints").exists()


def test_a_commit_staged_as_earlier_versions_named_it_is_finished_and_leaves_no_folder(tmp_path):
    step = tmp_path / "step"
    staged = step / ".staging" / "g4"  # a commit cut short by an earlier version: its nested staging folder
    staged.mkdir(parents=True)
    (staged / "rows.txt").write_text("rows")

    promote(str(step), ".staging/g4")

    assert _tree(step) == {"rows.txt": "rows"} and not (step / ".staging").exists()
