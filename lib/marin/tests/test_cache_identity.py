"""A cached result is reused only for the identity that made it, after any fault or move."""

import json
import os
import shutil
import sys
import textwrap
from dataclasses import dataclass

import pytest

from marin.execution.artifact import load_artifact
from marin.execution.records.executor_files import INFO_FILE, STATUS_FILE, read_status
from marin.execution.hashing.identity import identity_hash, identity_record, short_hash
from marin.execution.lazy import lazy_step, lower
from marin.execution.step_runner import OutputPathConflict, StepRunner
from marin.execution.step_spec import StepSpec


def _runner(prefix, **kwargs):
    return StepRunner(prefix=str(prefix), poll_s=0.05, **kwargs)


def _colliding_sweep_values(name: str) -> tuple[int, int]:
    """Two values of ``{"i": i}`` whose identities share their first 8 hex digits.

    The birthday bound makes this about 2**16 hashes; the pair is the same on every machine.
    """
    seen: dict[str, int] = {}
    for i in range(2_000_000):
        short = short_hash(identity_hash(identity_record(name, None, {"i": i}, ())))
        if short in seen:
            return seen[short], i
        seen[short] = i
    raise AssertionError("no collision found")


def test_two_configurations_whose_short_hashes_collide_never_share_a_result(tmp_path):
    first_i, second_i = _colliding_sweep_values("sweep")
    first = StepSpec("sweep", lambda: {"made_by": first_i}, hash_attrs={"i": first_i})
    second = StepSpec("sweep", lambda: {"made_by": second_i}, hash_attrs={"i": second_i})
    assert first.short_hash == second.short_hash and first.identity != second.identity
    runner = _runner(tmp_path / "prefix")
    assert runner.output_path_for(first) == runner.output_path_for(second)
    runner.run([first])
    with pytest.raises(OutputPathConflict) as info:
        runner.run([second])
    assert first.identity in str(info.value) and second.identity in str(info.value)
    assert load_artifact(runner.output_path_for(first)).result == {"made_by": first_i}


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_deleting_executor_info_never_turns_a_changed_configuration_into_a_cache_hit(tmp_path, damage):
    calls = []
    first = StepSpec("pre", lambda: calls.append(1) or "one", output_path="outputs/pre", hash_attrs={"param": 1})
    runner = _runner(tmp_path / "prefix")
    runner.run([first])
    info = os.path.join(runner.output_path_for(first), INFO_FILE)
    if damage == "delete":
        os.remove(info)
    else:
        with open(info, "w") as handle:
            handle.write("{not json")
    second = StepSpec("pre", lambda: calls.append(2) or "two", output_path="outputs/pre", hash_attrs={"param": 2})
    with pytest.raises(OutputPathConflict) as raised:
        runner.run([second])
    assert first.identity in str(raised.value) and second.identity in str(raised.value)
    assert calls == [1]
    # The same configuration is still a cache hit without its .executor_info.
    assert runner.run([first]).cached == ["pre"]


def test_success_whose_identity_cannot_be_confirmed_is_not_reused(tmp_path):
    calls = []
    step = StepSpec("pre", lambda: calls.append(1) or "one", output_path="outputs/pre", hash_attrs={"param": 1})
    runner = _runner(tmp_path / "prefix")
    folder = runner.output_path_for(step)
    os.makedirs(folder)
    # What an older runner (or a hand) leaves: SUCCESS with no identity anywhere.
    with open(os.path.join(folder, STATUS_FILE), "w") as handle:
        handle.write("SUCCESS")
    from marin.execution.step_runner import UnverifiedOutputError

    with pytest.raises(UnverifiedOutputError, match="cannot be confirmed"):
        runner.run([step])
    assert calls == []


@dataclass(frozen=True)
class Shards:
    folder: str
    files: list[str]


def test_a_copied_prefix_reads_its_own_outputs_and_a_moved_one_still_runs(tmp_path):
    def make_data(ctx) -> Shards:
        path = f"{ctx.output_path}/part-0.txt"
        with open(path, "w") as handle:
            handle.write("original")
        return Shards(ctx.output_path, [path])

    seen = []

    def consume(ctx):
        shards = ctx.load_artifact(data, Shards).result
        with open(shards.files[0]) as handle:
            seen.append((shards.folder, handle.read()))
        return shards.files[0]

    data = lazy_step("data/raw", make_data)
    first_use = lazy_step("use", consume, deps=[data], hash_attrs={"n": 1})
    original = tmp_path / "original"
    _runner(original).run([first_use])

    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    # The copy is edited; the original must not be what the copy's steps read.
    copied_file = copy / os.path.relpath(seen[0][0], original) / "part-0.txt"
    copied_file.write_text("copied")
    second_use = lazy_step("use", consume, deps=[data], hash_attrs={"n": 2})
    report = _runner(copy).run([second_use])
    assert report.cached == ["data/raw"] and report.ran == ["use"]
    assert seen[-1] == (str(copied_file.parent), "copied")
    # The copy's artifacts resolve to the copy, read directly too.
    use_folder = _runner(copy).output_path_for(lower(second_use)[-1])
    assert load_artifact(use_folder).result == str(copied_file)

    moved = tmp_path / "moved"
    shutil.move(str(original), str(moved))
    third_use = lazy_step("use", consume, deps=[data], hash_attrs={"n": 3})
    _runner(moved).run([third_use])
    assert seen[-1][1] == "original" and seen[-1][0].startswith(str(moved))


def test_artifact_result_type_never_imports_an_undeclared_module(tmp_path, monkeypatch):
    marker = tmp_path / "imported.txt"
    module_dir = tmp_path / "modules"
    module_dir.mkdir()
    (module_dir / "side_effect_module.py").write_text(
        textwrap.dedent(
            f"""
            open({str(marker)!r}, "w").write("imported")

            class Anything:
                def summary(self):
                    return "ran code from an artifact"
            """
        )
    )
    monkeypatch.syspath_prepend(str(module_dir))
    step = StepSpec("final", lambda: {"x": 1})
    runner = _runner(tmp_path / "prefix")
    runner.run([step])
    artifact_file = os.path.join(runner.output_path_for(step), ".artifact.json")
    record = json.loads(open(artifact_file).read())
    record["result_type"] = "side_effect_module:Anything"
    with open(artifact_file, "w") as handle:
        json.dump(record, handle)
    report = runner.run([step])
    assert report.cached == ["final"]
    assert not marker.exists()
    assert "side_effect_module" not in sys.modules


def test_changed_function_code_is_flagged_and_strict_refuses_it(tmp_path, caplog):
    namespace: dict = {}
    source = tmp_path / "steps_v1.py"

    def load(body: str):
        source.write_text(f"def preprocess():\n    return {body}\n")
        code = compile(source.read_text(), str(source), "exec")
        namespace.clear()
        exec(code, namespace)
        namespace["preprocess"].__module__ = "user_steps"
        return StepSpec("pre", namespace["preprocess"], hash_attrs={"param": 42})

    runner = _runner(tmp_path / "prefix")
    runner.run([load("1")])
    assert runner.run([load("1")]).cached == ["pre"]
    assert "code changed" not in caplog.text

    caplog.clear()
    changed = load("2")
    assert runner.run([changed]).cached == ["pre"]  # reused, but said loudly
    assert "code changed since this output was made" in caplog.text
    status = read_status(runner.output_path_for(changed))
    assert status is not None and status.status == "SUCCESS"

    from marin.execution.step_runner import CodeChangedError

    with pytest.raises(CodeChangedError, match="pre"):
        runner.run([changed], strict=True)


def test_marin_run_strict_refuses_outputs_of_changed_code(tmp_path, capsys):
    from marin import cli

    script = tmp_path / "pipeline.py"
    template = textwrap.dedent(
        """
        from marin.execution.step_runner import StepRunner
        from marin.execution.step_spec import StepSpec

        def preprocess():
            return BODY

        StepRunner().run([StepSpec("pre", preprocess, hash_attrs={"param": 42})])
        """
    )
    prefix = str(tmp_path / "prefix")
    script.write_text(template.replace("BODY", "1"))
    assert cli.main(["run", str(script), "--prefix", prefix]) == 0
    script.write_text("# a comment and blank lines change nothing\n\n" + template.replace("BODY", "1"))
    assert cli.main(["run", str(script), "--prefix", prefix, "--strict"]) == 0
    script.write_text(template.replace("BODY", "2"))
    capsys.readouterr()
    assert cli.main(["run", str(script), "--prefix", prefix, "--strict"]) == 2
    assert "Strict run" in capsys.readouterr().err
    assert cli.main(["run", str(script), "--prefix", prefix]) == 0


def test_a_tokenized_dataset_copied_with_its_prefix_reads_the_copy_after_the_original_is_gone(tmp_path):
    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
    from marin.experiment.data import tokenized
    from marin.processing.tokenize import TokenizedDataset
    from zephyr.token_cache import TokenCache

    texts = [f"Story {i}: the cat and the dog went to the park and sat in the sun." for i in range(40)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = os.path.join(save_tokenizer(train_bpe_tokenizer(texts, 300), str(tmp_path / "tok")), "tokenizer.json")
    handle = tokenized("tokenized/tiny", str(train), tokenizer)
    original = tmp_path / "original"
    runner = _runner(original)
    runner.run([handle])
    location = os.path.relpath(runner.output_path_for(lower(handle)[-1]), original)
    expected_first = TokenCache.open(load_artifact(str(original / location), TokenizedDataset).result.cache_path("train")).document(0)

    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    result = load_artifact(str(copy / location), TokenizedDataset).result
    assert result.cache_path("train") == str(copy / location / "train")
    assert TokenCache.open(result.cache_path("train")).document(0).tolist() == expected_first.tolist()
    assert _runner(copy).run([handle]).cached == ["tokenized/tiny"]
