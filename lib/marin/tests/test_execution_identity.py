"""Identity: what is hashed, what is not, and which definitions are refused."""

import enum
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from fray.cluster import ResourceConfig
from marin.execution.hashing.identity import InvalidStepError
from marin.execution.lazy import lazy_step, lower
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec


@dataclass(frozen=True)
class Adam:
    learning_rate: float
    weight_decay: float = 0.0


@dataclass(frozen=True)
class Sgd:
    learning_rate: float
    weight_decay: float = 0.0


@dataclass
class Mutable:
    x: int


class Color(enum.Enum):
    RED = 1


def _noop():
    return None


def test_identity_covers_name_version_attrs_and_deps_but_not_placement():
    base = StepSpec("s", _noop, hash_attrs={"a": 1})
    assert base.identity == StepSpec("s", lambda: 1, hash_attrs={"a": 1}).identity  # fn is not identity
    assert base.identity == StepSpec("s", _noop, hash_attrs={"a": 1}, resources=ResourceConfig.with_cpu(cpu=4)).identity
    assert base.identity == StepSpec("s", _noop, hash_attrs={"a": 1}, output_path="/elsewhere").identity
    assert base.identity != StepSpec("s", _noop, hash_attrs={"a": 2}).identity
    assert base.identity != StepSpec("t", _noop, hash_attrs={"a": 1}).identity
    assert base.identity != StepSpec("s", _noop, hash_attrs={"a": 1}, version="v2").identity
    up1, up2 = StepSpec("up", _noop, hash_attrs={"k": 1}), StepSpec("up", _noop, hash_attrs={"k": 2})
    assert StepSpec("d", _noop, deps=[up1]).identity != StepSpec("d", _noop, deps=[up2]).identity
    assert StepSpec("d", _noop, deps=[up1, base]).identity == StepSpec("d", _noop, deps=[base, up1]).identity
    assert len(base.short_hash) == 8


def test_dataclass_attrs_include_class_name_and_lazy_matches_spec():
    assert StepSpec("o", _noop, hash_attrs={"opt": Adam(1e-3)}).identity != StepSpec("o", _noop, hash_attrs={"opt": Sgd(1e-3)}).identity
    assert StepSpec("o", _noop, hash_attrs={"opt": Adam(1e-3)}).identity == StepSpec("o", _noop, hash_attrs={"opt": Adam(1e-3)}).identity
    assert StepSpec("o", _noop, hash_attrs={"n": 1}).identity != StepSpec("o", _noop, hash_attrs={"n": 1.0}).identity
    assert StepSpec("o", _noop, hash_attrs={"c": Color.RED}).identity
    handle = lazy_step("o", lambda ctx: None, hash_attrs={"opt": Adam(1e-3)}, version="v1")
    assert handle.identity == StepSpec("o", _noop, hash_attrs={"opt": Adam(1e-3)}, version="v1").identity


def test_a_lazy_handle_is_a_step_spec_whose_function_gets_the_context():
    up = lazy_step("data/up", lambda c: None, hash_attrs={"rows": 1})
    down = lazy_step("train/down", lambda c: None, deps=[up], version=2)
    assert isinstance(up, StepSpec) and up.call_style == "context"  # whatever its parameter is called
    assert down.version == "2" and down.deps == (up,)
    steps = lower(down)
    assert steps == [up, down] and steps[1] is down  # lowering lists steps; it builds none
    assert StepSpec("data/up", _noop, hash_attrs={"rows": 1}) == up  # one identity, one step, whatever the type
    assert StepSpec("report", _noop, deps=[down]).deps == (down,)  # specs and handles mix in deps


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"m": Mutable(1)}, "frozen"),
        ({"s": {1, 2}}, "JSON-like"),
        ({1: "x"}, "keys must be strings"),
        ({"f": float("nan")}, "finite"),
        ({"p": __import__("pathlib").Path("/tmp")}, "JSON-like"),
    ],
)
def test_unhashable_attrs_are_refused_with_a_clear_message(attrs, message):
    with pytest.raises(InvalidStepError, match=message):
        StepSpec("bad", _noop, hash_attrs=attrs)


def test_step_in_hash_attrs_points_to_deps():
    up = StepSpec("up", _noop)
    with pytest.raises(InvalidStepError, match="deps="):
        StepSpec("down", _noop, hash_attrs={"data": up})


@pytest.mark.parametrize(
    "name",
    ["", "../escape", "a/../b", "/abs/path", "gs://bucket/x", "has space", "semi;colon", "a//b", "./x",
     "data/raw\n", "line\nbreak", "a/.hidden", "C:drive", "trailing/", "x" * 201, "a/" + "y" * 201, "a/" * 500 + "b"],
)
def test_unsafe_names_are_refused(name):
    with pytest.raises(InvalidStepError):
        StepSpec(name, _noop)


@pytest.mark.parametrize("name", ["raw", "tokenized/tinystories", "a.b-c_d/0.1/x.", "_x/-y", "x" * 200, "a/" * 499 + "b"])
def test_safe_names_are_kept_as_given(name):
    assert StepSpec(name, _noop).name == name


def test_signature_with_two_required_parameters_is_refused():
    with pytest.raises(InvalidStepError, match="required parameters"):
        StepSpec("two", lambda a, b: None)


SCRIPT = textwrap.dedent(
    """
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner
    from marin.execution.lazy import lazy_step, lower

    up = lazy_step("data/up", lambda ctx: None, hash_attrs={"rows": 10})
    down = lazy_step("train/down", lambda ctx: None, deps=[up], version="v1")
    runner = StepRunner()
    for spec in lower(down):
        print(spec.name, spec.identity, runner.output_path_for(spec).removeprefix(runner.prefix))
    """
)


def test_same_script_same_hashes_under_two_prefixes_and_two_working_directories(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    outputs = []
    for index in range(2):
        cwd = tmp_path / f"cwd{index}"
        cwd.mkdir()
        env = {**os.environ, "MARIN_PREFIX": str(tmp_path / f"prefix{index}")}
        result = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, check=True)
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1]
    lines = outputs[0].split("\n")
    assert lines[0].startswith("data/up ") and "/data/up-" in lines[0]


def test_relative_and_absolute_explicit_output_paths(tmp_path):
    runner = StepRunner(prefix=str(tmp_path))
    assert runner.output_path_for(StepSpec("x", _noop, output_path="rel/dir")) == f"{tmp_path}/rel/dir"
    assert runner.output_path_for(StepSpec("x", _noop, output_path="memory://b/x")) == "memory://b/x"
    with pytest.raises(InvalidStepError, match=r"\.\."):
        StepSpec("x", _noop, output_path="../outside")


class Kind(enum.Enum):
    CAUSAL = "causal"


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    dropout: float = 0.0
    kind: Kind = Kind.CAUSAL


def test_identities_are_stable_across_releases():
    """Pinned digests: a change to how identities are computed would orphan every cached output.

    Computed by the code of earlier releases; nested, non-ASCII, float, enum and dataclass attributes,
    a version and dependencies all take part.
    """
    raw = StepSpec("data/raw", _noop, hash_attrs={"source": "roneneldan/TinyStories", "sample_count": 1000})
    tokens = StepSpec(
        "tokenized/stories", _noop, deps=[raw], version="v2",
        hash_attrs={"tokenizer": {"name": "gpt2", "vocab": 50257}, "text": "Ünïcode “quotes” \u2028",
                    "flags": [True, None, 1.5, -0.0]},
    )
    model = StepSpec(
        "checkpoints/tiny", _noop, deps=[tokens, raw], annotations={"flops": 1e12},
        hash_attrs={"shape": Shape(4, 128), "lr": 6e-4, "steps": 100, "nested": {"b": [1, {"z": 2, "a": 1e300}], "a": []}},
    )
    assert raw.identity == "dd4d1cf039253546a6fae340ecc80106c4c58c8fc2e22f516de3cacf416ca782"
    assert tokens.identity == "c66a10e8d8f73ae663240fab146321e552981562c0098acfb6ec2d468c4311f7"
    assert model.identity == "d4aec7c25ac9fc4c0cb06bd0e1a360408987f5f125edf138801b3997a6345996"


@pytest.mark.parametrize("version", [None, "", "v2", 'say "hi"\\', "Ünïcode \u2028 \x00 \t", "null"])
@pytest.mark.parametrize("hash_attrs", [{}, {"a": 1}, {"z": {"y": [1.5, None]}, "a": "\u00e9"}])
def test_a_step_hashes_exactly_the_record_it_stores(version, hash_attrs):
    """The identity is spelled out without building the record; it must be the record's hash, which
    ``.executor_info`` keeps and ``marin explain`` shows, for any version text and attributes."""
    from marin.execution.hashing.identity import identity_hash

    dep = StepSpec("data/raw", _noop, hash_attrs={"n": 1})
    for deps in ([], [dep], [dep, StepSpec("data/other", _noop)]):
        step = StepSpec("tokenized/x", _noop, deps=deps, version=version, hash_attrs=hash_attrs)
        assert step.identity == identity_hash(step.identity_record)
