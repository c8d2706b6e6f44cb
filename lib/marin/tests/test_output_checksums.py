"""A committed step's output files carry checksums: a file changed after the commit fails the step that
reads it, naming the file; steps committed before checksums existed still read; ``marin reproduce``
refuses a changed original, and a scratch prefix that a symbolic link leads into the original."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from pathlib import Path

import zstandard
from marin import cli
from marin.curation.quality import quality_filtered
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from rigging import filesystem as fsx
from storygen import generate_stories
from zephyr.output_checksums import MANIFEST_NAME

CHANGED = "the output was changed after the step finished"


def _documents(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    stories = generate_stories(8, seed=3)
    (folder / "docs.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(stories)))
    return str(folder)


def _flip_a_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_commit_records_each_output_file_and_the_zst_frames_carry_their_own_checksum(tmp_path):
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    curated = quality_filtered("curated/quality", _documents(tmp_path / "in"), gopher=None, backend="inline")
    assert not runner.run([curated]).failed
    folder = Path(runner.output_path_for(curated))

    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(folder).parts))
    assert manifest["algorithm"] == "sha256" and sorted(manifest["files"]) == files
    assert any(name.startswith("data/") for name in files) and ".artifact.json" not in manifest["files"]
    for name, entry in manifest["files"].items():
        assert entry == {"size": (folder / name).stat().st_size, "sha256": _sha256(folder / name)}
    shard = next((folder / "data").glob("*.jsonl.zst"))
    assert zstandard.get_frame_parameters(shard.read_bytes()).has_checksum


def test_a_byte_changed_in_a_committed_zst_shard_fails_the_tokenize_step_naming_the_file(tmp_path, real_data):
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    curated = quality_filtered("curated/quality", _documents(tmp_path / "in"), gopher=None, backend="inline")
    assert not runner.run([curated]).failed
    shard = next((Path(runner.output_path_for(curated)) / "data").glob("*.jsonl.zst"))
    recorded = _sha256(shard)
    _flip_a_byte(shard)

    tokens = tokenized("tokenized/curated", curated, str(real_data.gpt2), backend="inline")
    report = runner.run([tokens], raise_on_failure=False)
    assert report.failed == ["tokenized/curated"]
    error = report.outcome_of("tokenized/curated").error
    assert f"{shard}: its sha256 is {_sha256(shard)} but the step recorded {recorded} when it committed; {CHANGED}" in error
    assert not (Path(runner.output_path_for(tokens)) / ".artifact.json").exists()


def test_a_changed_plain_jsonl_output_fails_the_curation_step_that_reads_it(tmp_path):
    stories = generate_stories(6, seed=4)

    def write_documents(ctx) -> dict:
        url = fsx.join(ctx.output_path, "documents.jsonl")
        fsx.atomic_write(url, "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(stories)))
        return {"files": [url]}

    raw = lazy_step("raw/documents", write_documents)
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    assert not runner.run([raw]).failed
    documents = Path(runner.output_path_for(raw)) / "documents.jsonl"
    # Still valid JSON, and a story still: only the checksum can tell.
    documents.write_text(documents.read_text().replace(" the ", " a ", 1))

    curated = quality_filtered("curated/quality", raw, gopher=None, backend="inline")
    report = runner.run([curated], raise_on_failure=False)
    assert report.failed == ["curated/quality"]
    error = report.outcome_of("curated/quality").error
    assert f"{documents}: it holds" in error and "when it committed" in error and CHANGED in error


def test_a_step_committed_without_checksums_is_still_read(tmp_path):
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    curated = quality_filtered("curated/quality", _documents(tmp_path / "in"), gopher=None, backend="inline")
    assert not runner.run([curated]).failed
    (Path(runner.output_path_for(curated)) / MANIFEST_NAME).unlink()  # as older code committed it

    again = quality_filtered("curated/again", curated, gopher=None, backend="inline")
    assert not runner.run([again]).failed
    result = load_artifact(runner.output_path_for(again), CuratedDataset).result
    first = load_artifact(runner.output_path_for(curated), CuratedDataset).result
    assert [r["text"] for r in read_curated(result.files)] == [r["text"] for r in read_curated(first.files)]


SCRIPT = textwrap.dedent(
    """
    from pathlib import Path
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def count(output_path):
        Path(output_path, "count.txt").write_text("3")

    if __name__ == "__main__":
        StepRunner().run([StepSpec("small/count", count)])
    """
)


def _finished_step(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "count.py"
    script.write_text(SCRIPT)
    prefix = tmp_path / "prefix"
    assert cli.main(["run", str(script), "--prefix", str(prefix)]) == 0
    return script, prefix


def test_reproduce_refuses_a_scratch_prefix_a_symbolic_link_leads_into_the_original(tmp_path, capsys):
    script, prefix = _finished_step(tmp_path)
    (prefix / "inside").mkdir()
    into = tmp_path / "into-the-prefix"
    into.symlink_to(prefix / "inside")
    around = tmp_path / "around-the-prefix"
    around.symlink_to(tmp_path)
    before = sorted(str(p) for p in prefix.rglob("*"))

    for scratch in (into, around / "prefix" / "x", around):
        capsys.readouterr()
        code = cli.main(["reproduce", str(script), "small/count", "--prefix", str(prefix), "--scratch", str(scratch)])
        err = capsys.readouterr().err
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and "overlaps the original prefix" in err and str(scratch) in err
    assert sorted(str(p) for p in prefix.rglob("*")) == before


def test_reproduce_refuses_an_original_changed_after_it_was_committed(tmp_path, capsys):
    script, prefix = _finished_step(tmp_path)
    (count,) = prefix.glob("small/count-*/count.txt")
    recorded = _sha256(count)
    count.write_text("4")

    capsys.readouterr()
    code = cli.main(["reproduce", str(script), "small/count", "--prefix", str(prefix), "--scratch", str(tmp_path / "scratch")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{count}: its sha256 is {_sha256(count)} but the step recorded {recorded} when it committed; {CHANGED}" in err
    assert not (tmp_path / "scratch").exists()  # refused before anything ran

    count.write_text("3")
    code = cli.main(["reproduce", str(script), "small/count", "--prefix", str(prefix), "--scratch", str(tmp_path / "scratch")])
    assert code == 0, capsys.readouterr().err


def test_moved_prefix_keeps_reading_its_checked_outputs(tmp_path):
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    curated = quality_filtered("curated/quality", _documents(tmp_path / "in"), gopher=None, backend="inline")
    assert not runner.run([curated]).failed
    os.rename(tmp_path / "prefix", tmp_path / "moved")
    moved = StepRunner(prefix=str(tmp_path / "moved"))
    again = quality_filtered("curated/again", curated, gopher=None, backend="inline")
    assert not moved.run([again]).failed


def test_the_engine_leaves_checkpoints_and_token_cache_shards_to_their_own_checksums(tmp_path):
    from levanter.trainer.checkpoint_manifest import MANIFEST_NAME as CHECKPOINT_MANIFEST
    from marin.execution.ownership.step_ownership import SELF_CHECKED_MARKERS
    from marin.execution.step_spec import StepSpec
    from zephyr.token_cache.layout import SHARD_SUMMARY_NAME

    assert set(SELF_CHECKED_MARKERS) == {CHECKPOINT_MANIFEST, SHARD_SUMMARY_NAME}

    def writes_a_checkpoint(ctx):
        step = Path(ctx.output_path) / "checkpoints" / "step-3"
        step.mkdir(parents=True)
        (step / "arrays").write_bytes(b"\1" * 32)
        (step / CHECKPOINT_MANIFEST).write_text("{}")
        (Path(ctx.output_path) / "eval.json").write_text("{}")
        return {}

    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    spec = StepSpec("trains", writes_a_checkpoint)
    assert not runner.run([spec]).failed
    manifest = json.loads((Path(runner.output_path_for(spec)) / MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == ["eval.json"]
