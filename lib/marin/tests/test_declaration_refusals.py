"""Definitions the engine refuses when they are declared, and records it reports clearly when damaged."""

import json
import os

import pytest

from marin import cli
from marin.execution.artifact import ArtifactError, load_artifact
from marin.execution.records.executor_files import INFO_FILE
from marin.execution.hashing.identity import InvalidStepError
from marin.execution.lazy import StepGraphError, lazy_step, lower
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec


def _noop():
    return None


def test_a_name_too_long_for_a_folder_is_refused_when_declared():
    with pytest.raises(InvalidStepError, match="characters"):
        StepSpec("x" * 300, _noop)
    with pytest.raises(InvalidStepError, match="characters"):
        lazy_step("data/" + "y" * 250, lambda ctx: None)
    StepSpec("a/" + "z" * 190, _noop)  # long but fine


@pytest.mark.parametrize("name", [".hidden", "data/.cache", ".."])
def test_names_with_a_hidden_segment_are_refused(name):
    with pytest.raises(InvalidStepError):
        StepSpec(name, _noop)


@pytest.mark.parametrize("output_path", ["/", ".", "./", "gs://bucket", "s3://bucket/"])
def test_an_output_path_at_a_root_is_refused(output_path):
    with pytest.raises(InvalidStepError, match="root"):
        StepSpec("pre", _noop, output_path=output_path)


def test_hash_attrs_that_contain_themselves_are_refused_not_recursed():
    attrs: dict = {"a": 1}
    attrs["self"] = attrs
    with pytest.raises(InvalidStepError, match="refers back"):
        StepSpec("loop", _noop, hash_attrs=attrs)
    items: list = [1]
    items.append(items)
    with pytest.raises(InvalidStepError, match=r"hash_attrs.items\[1\]"):
        lazy_step("loop", lambda ctx: None, hash_attrs={"items": items})
    shared = {"x": 1}
    StepSpec("diamond", _noop, hash_attrs={"a": shared, "b": shared})  # shared, not cyclic: fine


def test_two_different_functions_with_one_name_and_attrs_are_refused(tmp_path):
    first = StepSpec("pre", lambda: "first", hash_attrs={"param": 1})
    second = StepSpec("pre", lambda: "second", hash_attrs={"param": 1})
    assert first.identity == second.identity and first.fn_description == second.fn_description
    with pytest.raises(StepGraphError, match="share identity"):
        StepRunner(prefix=str(tmp_path)).run([first, second])
    handle_a = lazy_step("pre", lambda ctx: "first")
    handle_b = lazy_step("pre", lambda ctx: "second")
    with pytest.raises(StepGraphError, match="share identity"):
        lower(handle_a, handle_b)
    # The same function declared twice is one step.
    assert len(lower(lazy_step("same", _noop_ctx), lazy_step("same", _noop_ctx))) == 1


def _noop_ctx(ctx):
    return None


def test_marin_explain_on_a_corrupt_executor_info_says_it_is_corrupt(tmp_path, capsys):
    step = StepSpec("data/rows", _noop, hash_attrs={"rows": 1})
    runner = StepRunner(prefix=str(tmp_path))
    runner.run([step])
    info = os.path.join(runner.output_path_for(step), INFO_FILE)
    with open(info, "w") as handle:
        handle.write('{"name": "data/rows", ')
    code = cli.main(["explain", "data/rows", "--prefix", str(tmp_path)])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code != 0
    assert "corrupt" in text and info in text
    assert "no step output found" not in text


def test_a_corrupt_artifact_says_which_file_and_what_to_do(tmp_path):
    step = StepSpec("data/rows", lambda: {"rows": 1})
    runner = StepRunner(prefix=str(tmp_path))
    runner.run([step])
    folder = runner.output_path_for(step)
    with open(os.path.join(folder, ".artifact.json"), "w") as handle:
        handle.write('{"result": ')
    with pytest.raises(ArtifactError) as raised:
        load_artifact(folder)
    message = str(raised.value)
    assert ".artifact.json is corrupt" in message and "Delete the step's folder" in message and folder in message


def test_marin_status_shows_steps_and_flags_changed_code(tmp_path, capsys):
    source = tmp_path / "steps.py"
    namespace: dict = {}

    def declare(body: str) -> StepSpec:
        source.write_text(f"def preprocess():\n    return {body}\n")
        exec(compile(source.read_text(), str(source), "exec"), namespace)
        return StepSpec("pre", namespace["preprocess"], hash_attrs={"param": 42})

    StepRunner(prefix=str(tmp_path / "prefix")).run([declare("1")])
    assert cli.main(["status", "--prefix", str(tmp_path / "prefix")]) == 0
    assert "code changed" not in capsys.readouterr().out
    declare("2")  # the file now holds other code than what made the output
    assert cli.main(["status", "--prefix", str(tmp_path / "prefix")]) == 0
    out = capsys.readouterr().out
    assert "pre" in out and "code changed" in out
    record = json.loads(open(os.path.join(tmp_path / "prefix", [d for d in os.listdir(tmp_path / "prefix") if d.startswith("pre-")][0], INFO_FILE)).read())
    assert record["code"]["file"] == str(source) and record["code"]["qualname"] == "preprocess"


def test_the_same_function_in_two_files_is_fingerprinted_from_its_own_file(tmp_path):
    # Code objects compare equal whatever file they came from: the fingerprint must still name each one's file.
    from marin.execution.hashing.code_fingerprint import fingerprint_function

    functions = []
    for name in ("first.py", "second.py"):
        source = tmp_path / name
        source.write_text("def preprocess():\n    return 1\n")
        namespace: dict = {}
        exec(compile(source.read_text(), str(source), "exec"), namespace)
        functions.append(namespace["preprocess"])
    assert functions[0].__code__ == functions[1].__code__
    assert [fingerprint_function(fn).file for fn in functions] == [str(tmp_path / "first.py"), str(tmp_path / "second.py")]
