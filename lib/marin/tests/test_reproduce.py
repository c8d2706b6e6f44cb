"""``marin reproduce SCRIPT STEP``: a finished step rerun in a scratch prefix is bit-identical on the
same machine; an altered checkpoint names the tensor, an altered token shard or data file the record;
a step whose identity or code changed since is refused; the original prefix is never written.

The training shapes are those of test_experiment_train.py, so the compiled step is shared."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import tempfile
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import zstandard

from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin import cli
from rigging import filesystem as fsx
from zephyr.output_checksums import write_checksums

TRAIN_SCRIPT = textwrap.dedent(
    """
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from marin.execution.step_runner import StepRunner
    from marin.experiment.data import tokenized
    from marin.experiment.train import train_lm

    INPUTS = {inputs!r}
    TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=128)
    data = tokenized("tokenized/stories", INPUTS + "/train.jsonl", INPUTS + "/tokenizer",
                     validation=INPUTS + "/validation.jsonl")
    model = train_lm(name="checkpoints/tiny", model=TINY, optimizer=AdamConfig(learning_rate=3e-3), datasets={{data: 1.0}},
                     batch_size=8, seq_len=128, num_train_steps={steps}, num_samples=1, steps_per_checkpoint=3)

    if __name__ == "__main__":
        StepRunner().run([model])
    """
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synthetic_stories):
    """The train script run once with ``marin run``: (script, prefix)."""
    root = tmp_path_factory.mktemp("reproduce")
    inputs = root / "inputs"
    inputs.mkdir()
    for name, texts in (("train", synthetic_stories[:150]), ("validation", synthetic_stories[300:330])):
        (inputs / f"{name}.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:150], 512), str(inputs / "tokenizer"))
    script = root / "train_tiny.py"
    script.write_text(TRAIN_SCRIPT.format(inputs=str(inputs), steps=6))
    prefix = str(root / "prefix")
    assert cli.main(["run", str(script), "--prefix", prefix]) == 0
    return script, prefix


@pytest.fixture(autouse=True)
def _temporary_folders_in_tmp_path(tmp_path, monkeypatch):
    # The default scratch prefix is a new temporary folder: a rerun kept because it differs stays
    # with the test's own files instead of piling up in the system's temporary folder.
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))


def _reproduce(capsys, *args: str) -> tuple[int, str, str]:
    """Exit status, the report (from its verdict line on; the rerun's own summary comes before it), stderr."""
    capsys.readouterr()
    code = cli.main(["reproduce", *args])
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("bit-identical: ", "different: "))), len(lines))
    return code, "\n".join(lines[start:]), captured.err


def _snapshot(prefix: str) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in Path(prefix).rglob("*") if p.is_file()}


def _copy(prefix: str, tmp_path: Path) -> str:
    copy = tmp_path / "copy"
    shutil.copytree(prefix, copy)
    return str(copy)


def _folder(prefix: str, name: str) -> Path:
    (folder,) = Path(prefix).glob(f"{name}-*")
    return folder


def _as_if_the_step_wrote_it(folder: Path | str) -> None:
    """Record the checksums of the folder's files as they are now: an original that really differs from
    its rerun, rather than one changed after it was committed (which reproduce refuses). Three records:
    each checkpoint's manifest, each token cache's checksums (shard summaries and ledger), and the
    step's own manifest of the rest."""
    from levanter.trainer.checkpoint_manifest import MANIFEST_NAME as CHECKPOINT_MANIFEST
    from levanter.trainer.checkpoint_manifest import write_manifest
    from levanter.trainer.checkpoint_staging import COMMIT_MARKER
    from marin.execution.ownership.step_ownership import SELF_CHECKED_MARKERS
    from zephyr.token_cache.layout import CHECKSUM_ALGORITHM, LEDGER_NAME, SHARD_SUMMARY_NAME, new_hasher

    def digest(url: str) -> str:
        with fsx.open_url(url, "rb") as handle:
            return f"{CHECKSUM_ALGORITHM}:{new_hasher(handle.read()).hexdigest()}"

    folder = str(folder)
    names = fsx.find_files(folder)
    for name in names:
        parent, base = name.rsplit("/", 1) if "/" in name else ("", name)
        if base == CHECKPOINT_MANIFEST:
            write_manifest(fsx.join(folder, parent), exclude=(COMMIT_MARKER,))
        elif base == LEDGER_NAME:
            cache = fsx.join(folder, parent)
            ledger = json.loads(fsx.read_text(fsx.join(cache, LEDGER_NAME)))
            for shard in ledger["shards"]:
                shard["checksums"] = {file: digest(fsx.join(cache, shard["path"], file)) for file in shard["checksums"]}
                summary_url = fsx.join(cache, shard["path"], SHARD_SUMMARY_NAME)
                summary = json.loads(fsx.read_text(summary_url))
                fsx.atomic_write(summary_url, json.dumps({**summary, "checksums": shard["checksums"]}))
            fsx.atomic_write(fsx.join(cache, LEDGER_NAME), json.dumps(ledger))
    write_checksums(folder, self_checked=SELF_CHECKED_MARKERS)


def test_tokenize_and_train_steps_reproduce_bit_identically_and_leave_the_original_alone(trained, capsys, tmp_path):
    script, prefix = trained
    before = _snapshot(prefix)
    code, out, err = _reproduce(capsys, str(script), "tokenized/stories", "--prefix", prefix)
    assert code == 0, err
    assert out.startswith("bit-identical: tokenized/stories (9 files compared")

    scratch = str(tmp_path / "scratch")
    code, out, err = _reproduce(capsys, str(script), "checkpoints/tiny", "--prefix", prefix, "--scratch", scratch, "--keep")
    assert code == 0, err
    first = out.splitlines()[0]
    # Two checkpoints of 67 arrays each (parameters and both Adam moments), and the export's tensors.
    assert first.startswith("bit-identical: checkpoints/tiny (") and "134 arrays compared" in first
    assert f"input:    tokenized/stories: {_folder(prefix, 'tokenized/stories')} (read only)" in out
    assert _snapshot(prefix) == before
    rerun = _folder(scratch, "checkpoints/tiny")
    assert (rerun / "checkpoints" / "6" / "state").is_dir()
    assert not (Path(scratch) / "tokenized").exists()  # the input was read where it is, not remade


def test_an_altered_checkpoint_and_export_name_the_tensor_and_its_largest_difference(trained, capsys, tmp_path):
    script, prefix = trained
    copy = _copy(prefix, tmp_path)
    model = _folder(copy, "checkpoints/tiny")
    _rewrite_checkpoint_array(model / "checkpoints" / "6", "params.embed.weight", (3, 7), 0.25)
    tensor = _flip_a_bit_of_the_first_tensor(model / "hf" / "model.safetensors")
    _as_if_the_step_wrote_it(model)

    code, out, err = _reproduce(capsys, str(script), "checkpoints/tiny", "--prefix", copy, "--all")
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0].startswith("different: checkpoints/tiny: first difference in checkpoints/6: tensor params.embed.weight differs: "
                               "largest absolute difference 0.25 at index (3, 7)")
    assert "1 of 16,384 elements differ (1 of 67 arrays differ)" in lines[0]
    assert any(line.startswith(f"  also differs: hf/model.safetensors: tensor {tensor} differs") for line in lines)
    assert "checkpoints/3" not in out  # the untouched checkpoint matches
    assert "(kept)" in out


def test_an_altered_token_shard_names_the_record(trained, capsys, tmp_path):
    script, prefix = trained
    copy = _copy(prefix, tmp_path)
    shard = _folder(copy, "tokenized/stories") / "train" / "shard-00000"
    offsets = np.fromfile(shard / "offsets.bin", dtype="<i8")
    tokens = np.fromfile(shard / "tokens.bin", dtype="<u2")
    position = int(offsets[7]) + 2  # the third token of record 7
    tokens[position] = (int(tokens[position]) + 1) % 512
    tokens.tofile(shard / "tokens.bin")
    _as_if_the_step_wrote_it(_folder(copy, "tokenized/stories"))

    code, out, err = _reproduce(capsys, str(script), "tokenized/stories", "--prefix", copy)
    assert code == 1, err
    assert out.splitlines()[0].startswith(
        "different: tokenized/stories: first difference in train/shard-00000: record 7 (record 7 of the cache train/) "
        "differs: its token 2 is"
    )


def test_a_step_whose_identity_changed_since_is_refused_naming_both(trained, capsys, tmp_path):
    script, prefix = trained
    folder = _folder(prefix, "checkpoints/tiny").name
    changed = tmp_path / "train_longer.py"
    inputs = str(Path(script).parent / "inputs")
    changed.write_text(TRAIN_SCRIPT.format(inputs=inputs, steps=7))

    code, _, err = _reproduce(capsys, str(changed), f"checkpoints/{folder}", "--prefix", prefix)
    assert code == 2
    assert f"holds step 'checkpoints/tiny' with identity {folder[-8:]}, but the script now declares it with identity" in err
    assert "changed since" in err and "marin explain" in err

    code, _, err = _reproduce(capsys, str(changed), "checkpoints/tiny", "--prefix", prefix)
    assert code == 2 and "which has no output under" in err and folder in err

    code, _, err = _reproduce(capsys, str(script), "checkpoints/tinyy", "--prefix", prefix)
    assert code == 2 and "declares no step 'checkpoints/tinyy'; its steps are: checkpoints/tiny, tokenized/stories" in err

    code, _, err = _reproduce(capsys, str(script), "checkpoints/tiny", "--prefix", prefix, "--scratch", prefix + "/scratch")
    assert code == 2 and "overlaps the original prefix" in err


CURATION_SCRIPT = textwrap.dedent(
    """
    import json
    from marin.curation.dedup_steps import exact_deduplicated
    from marin.curation.quality import quality_filtered
    from marin.execution.lazy import lazy_step
    from marin.execution.step_runner import StepRunner
    from rigging import filesystem as fsx
    from storygen import generate_stories

    def write_documents(ctx) -> dict:
        stories = generate_stories(30, seed=5)
        docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(stories + stories[:4] + ["too short"])]
        url = fsx.join(ctx.output_path, "documents.jsonl")
        fsx.atomic_write(url, "".join(json.dumps(d) + "\\n" for d in docs[:LIMIT]))
        return {"files": [url]}

    raw = lazy_step("raw/documents", write_documents)
    good = quality_filtered("curated/quality", raw)
    unique = exact_deduplicated("curated/exact", good, output_format="parquet")

    if __name__ == "__main__":
        StepRunner().run([unique])
    """
)


def test_curation_steps_reproduce_and_an_altered_record_or_changed_code_is_caught(tmp_path, capsys):
    script = tmp_path / "curate.py"
    script.write_text(CURATION_SCRIPT.replace("LIMIT", "None"))
    prefix = str(tmp_path / "prefix")
    assert cli.main(["run", str(script), "--prefix", prefix]) == 0

    code, out, err = _reproduce(capsys, str(script), "curated/exact", "--prefix", prefix)
    assert code == 0, err
    assert out.startswith("bit-identical: curated/exact (") and "curated/quality" in out

    data = next((_folder(prefix, "curated/quality") / "data").glob("*.jsonl.zst"))
    records = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data.read_bytes())).read().decode().splitlines()
    altered = json.loads(records[3])
    altered["text"] = altered["text"].replace("the", "a", 1)
    records[3] = json.dumps(altered)
    data.write_bytes(zstandard.compress("".join(r + "\n" for r in records).encode()))
    code, _, err = _reproduce(capsys, str(script), "curated/quality", "--prefix", prefix)
    assert code == 2 and f"{data}: it holds" in err and "when it committed; the output was changed after the step finished" in err
    _as_if_the_step_wrote_it(data.parent.parent)
    code, out, _ = _reproduce(capsys, str(script), "curated/quality", "--prefix", prefix)
    assert code == 1
    assert out.startswith(f"different: curated/quality: first difference in data/{data.name}: record 3 differs: text: ")

    # Same identity, other code: refused unless asked, then the first record it changes is named.
    script.write_text(CURATION_SCRIPT.replace("LIMIT", "-1"))
    code, _, err = _reproduce(capsys, str(script), "raw/documents", "--prefix", prefix)
    assert code == 2 and "its code changed since" in err and "--changed-code" in err
    code, out, _ = _reproduce(capsys, str(script), "raw/documents", "--prefix", prefix, "--changed-code")
    assert code == 1
    assert out.startswith("different: raw/documents: first difference in documents.jsonl: record 34: only in the original")


def test_a_rerun_that_fails_exits_1_and_keeps_its_folder(tmp_path, capsys, monkeypatch):
    script = tmp_path / "flaky.py"
    script.write_text(textwrap.dedent(
        """
        import os
        from pathlib import Path
        from marin.execution.step_runner import StepRunner
        from marin.execution.step_spec import StepSpec

        def count(output_path):
            if os.environ.get("FLAKY_STEP_FAILS"):
                raise RuntimeError("the machine ran out of luck")
            Path(output_path, "count.txt").write_text("3")

        if __name__ == "__main__":
            StepRunner().run([StepSpec("flaky/count", count)])
        """
    ))
    prefix = str(tmp_path / "prefix")
    assert cli.main(["run", str(script), "--prefix", prefix]) == 0
    monkeypatch.setenv("FLAKY_STEP_FAILS", "1")
    scratch = tmp_path / "scratch"
    code, _, err = _reproduce(capsys, str(script), "flaky/count", "--prefix", prefix, "--scratch", str(scratch))
    assert code == 1
    assert "The rerun of 'flaky/count' failed (RuntimeError: the machine ran out of luck); its folder is kept" in err
    assert (_folder(str(scratch), "flaky/count") / ".executor_status").exists()


def test_reproduce_on_object_storage_reads_and_writes_only_urls(s3_prefix, trained, capsys, tmp_path, monkeypatch):
    script, _ = trained
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert cli.main(["run", str(script), "--prefix", s3_prefix, "--run-only", "tokenized/stories"]) == 0
    scratch = s3_prefix.rsplit("/", 1)[0] + f"/scratch-{uuid.uuid4().hex[:8]}"
    code, out, err = _reproduce(capsys, str(script), "tokenized/stories", "--prefix", s3_prefix, "--scratch", scratch)
    assert code == 0, err
    assert out.startswith("bit-identical: tokenized/stories (9 files compared")
    assert not fsx.find_files(scratch)  # an identical rerun is removed

    (folder,) = [f for f in fsx.ls(fsx.join(s3_prefix, "tokenized")) if "stories-" in f]
    tokens_url = fsx.join(folder, "validation", "shard-00000", "tokens.bin")
    with fsx.open_url(tokens_url, "rb") as handle:
        tokens = bytearray(handle.read())
    tokens[0] ^= 1  # the first token of record 0
    fsx.atomic_write(tokens_url, bytes(tokens))
    code, _, err = _reproduce(capsys, str(script), "tokenized/stories", "--prefix", s3_prefix, "--scratch", scratch)
    # The cache is left out of the step's manifest (it carries checksums of its own): its own check names the file.
    assert code == 2 and "tokens.bin" in err and "the output was changed after the step finished" in err, err
    _as_if_the_step_wrote_it(folder)  # as if the step had written these bytes: then the comparison names the record
    code, out, _ = _reproduce(capsys, str(script), "tokenized/stories", "--prefix", s3_prefix, "--scratch", scratch)
    assert code == 1
    assert "first difference in validation/shard-00000: record 0 (record 0 of the cache validation/) differs: its token 0" in out
    assert not os.listdir(cwd)


def test_a_training_step_under_an_object_store_prefix_reproduces_through_staged_checkpoints(trained, capsys):
    # memory:// is an object store Orbax cannot write itself: checkpoints are staged and uploaded,
    # and compared after a download, as on s3://.
    script, _ = trained
    root = f"memory://reproduce-{uuid.uuid4().hex[:8]}"
    assert cli.main(["run", str(script), "--prefix", f"{root}/prefix"]) == 0
    code, out, err = _reproduce(capsys, str(script), "checkpoints/tiny", "--prefix", f"{root}/prefix", "--scratch", f"{root}/scratch")
    assert code == 0, err
    assert out.startswith("bit-identical: checkpoints/tiny (") and "134 arrays compared" in out.splitlines()[0]
    assert not fsx.find_files(f"{root}/scratch")


# -- altering outputs the way damage or a different run would -------------------------------------


def _rewrite_checkpoint_array(step: Path, name: str, index: tuple[int, ...], delta: float) -> None:
    """Save the checkpoint step again with one element of one array moved by ``delta``."""
    from levanter.trainer.checkpoint import Checkpointer
    from levanter.trainer.checkpoint_arrays import open_checkpoint_arrays

    with open_checkpoint_arrays(str(step)) as arrays:
        state = arrays.read(list(arrays.stored))
    state[name] = state[name].copy()
    state[name][index] += delta
    staging = step.parent.parent / "rewrite"
    writer = Checkpointer(str(staging), asynchronous=False)
    writer.save(int(step.name), state)
    writer.close()
    shutil.rmtree(step / "state")
    shutil.move(staging / step.name / "state", step / "state")
    shutil.rmtree(staging)


def _flip_a_bit_of_the_first_tensor(path: Path) -> str:
    """Flip the lowest bit of the first value stored in a safetensors file; the tensor's name."""
    data = bytearray(path.read_bytes())
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_size])
    name, entry = min(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
    data[8 + header_size + entry["data_offsets"][0]] ^= 1
    path.write_bytes(bytes(data))
    return name
