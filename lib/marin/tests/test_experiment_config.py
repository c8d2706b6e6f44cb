"""Settings from YAML files and `a.b=value` overrides, and `marin run --set/--config` reaching a script."""

import dataclasses
import enum
import json
import os
import textwrap
from pathlib import Path
from typing import Any, Literal

import pytest

from marin import cli
from levanter.optim import AdamConfig, LionConfig, MuonConfig, OptimizerConfig
from marin.experiment.config import ConfigError, apply_overrides, dump_config, load_config, script_config


class Schedule(enum.Enum):
    COSINE = "cosine"
    LINEAR = "linear"


@dataclasses.dataclass(frozen=True)
class Optim:
    learning_rate: float = 1e-3
    schedule: Schedule = Schedule.COSINE
    betas: tuple[float, float] = (0.9, 0.95)


@dataclasses.dataclass(frozen=True)
class Run:
    num_train_steps: int = 10
    name: str = "tiny"
    use_scan: bool = False
    seed: int | None = None
    tags: tuple[str, ...] = ()
    dtype: Literal["float32", "bfloat16"] = "float32"
    optimizer: Optim = dataclasses.field(default_factory=Optim)
    warm_start: Optim | None = None


def test_overrides_set_nested_and_typed_fields_and_leave_the_original_alone():
    base = Run()
    new = apply_overrides(
        base,
        [
            "num_train_steps=3",
            "optimizer.learning_rate=1e-2",
            "optimizer.schedule=linear",
            "optimizer.betas=[0.8, 0.9]",
            "use_scan=true",
            "seed=7",
            "tags=[a, b]",
            "name=123",
            "dtype=bfloat16",
        ],
    )
    assert new == Run(
        num_train_steps=3,
        name="123",
        use_scan=True,
        seed=7,
        tags=("a", "b"),
        dtype="bfloat16",
        optimizer=Optim(learning_rate=0.01, schedule=Schedule.LINEAR, betas=(0.8, 0.9)),
    )
    assert isinstance(new.optimizer.learning_rate, float) and isinstance(new.optimizer.betas, tuple)
    assert base == Run()
    assert apply_overrides(new, ["seed=null"]).seed is None
    assert apply_overrides(base, ["warm_start={learning_rate: 0.5}"]).warm_start == Optim(learning_rate=0.5)
    assert apply_overrides(base, ["optimizer.learning_rate=2"]).optimizer.learning_rate == 2.0


def test_unknown_key_is_refused_with_the_closest_field_names():
    with pytest.raises(ConfigError, match=r"optimizer\.learnin_rate.*Did you mean 'learning_rate'"):
        apply_overrides(Run(), ["optimizer.learnin_rate=0.1"])
    with pytest.raises(ConfigError, match=r"num_train_step.*Did you mean 'num_train_steps'"):
        apply_overrides(Run(), ["num_train_step=3"])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        apply_overrides(Run(), ["num_train_steps"])
    with pytest.raises(ConfigError, match=r"warm_start\.learning_rate.*is None"):
        apply_overrides(Run(), ["warm_start.learning_rate=0.1"])


@pytest.mark.parametrize(
    "override, expected",
    [
        ("num_train_steps=abc", r"'num_train_steps': expected int, got abc"),
        ("num_train_steps=1.5", r"'num_train_steps': expected int"),
        ("use_scan=maybe", r"'use_scan': expected bool"),
        ("optimizer.schedule=step", r"'optimizer.schedule': expected Schedule"),
        ("optimizer.betas=[0.9]", r"'optimizer.betas': expected tuple\[float, float\]"),
        ("tags=[1, [2]]", r"'tags\[1\]': expected str"),
        ("dtype=float16", r"'dtype': expected Literal"),
    ],
)
def test_a_bad_value_names_the_field_and_its_type(override, expected):
    with pytest.raises(ConfigError, match=expected):
        apply_overrides(Run(), [override])


def test_yaml_round_trip_and_unknown_keys_in_files(tmp_path):
    config = apply_overrides(Run(), ["optimizer.schedule=linear", "tags=[x]", "seed=3", "warm_start={learning_rate: 1e-5}"])
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(config))
    assert "schedule: linear" in path.read_text()
    assert load_config(Run, str(path)) == config

    partial = tmp_path / "partial.yaml"
    partial.write_text("optimizer:\n  learning_rate: 0.5\n")
    assert load_config(Run, str(partial)) == Run(optimizer=Optim(learning_rate=0.5))

    bad = tmp_path / "bad.yaml"
    bad.write_text("optimizer:\n  lr: 0.5\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: optimizer\.lr.*Optim has no field 'lr'"):
        load_config(Run, str(bad))


def test_script_config_under_plain_python_returns_the_defaults():
    assert script_config(Run, "train") == Run()
    assert script_config(Run, "train", Run(num_train_steps=4)) == Run(num_train_steps=4)


SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os
    from marin.execution.step_spec import StepSpec
    from marin.execution.step_runner import StepRunner
    from marin.experiment.config import script_config

    @dataclasses.dataclass(frozen=True)
    class TrainSettings:
        num_train_steps: int = 10
        learning_rate: float = 1e-3
        seed: int = 0

    settings = script_config(TrainSettings, "train")
    step = StepSpec("train/model", fn=lambda: None, hash_attrs={"train": settings})
    report = StepRunner().run([step])
    with open(os.environ["SETTINGS_LOG"], "a") as handle:
        handle.write(json.dumps({"settings": dataclasses.asdict(settings), "hash": step.short_hash,
                                 "ran": report.ran, "cached": report.cached}) + "\\n")
    """
)


@pytest.fixture
def settings_script(tmp_path, monkeypatch):
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    log = tmp_path / "settings.jsonl"
    monkeypatch.setenv("SETTINGS_LOG", str(log))
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)

    def runs():
        return [json.loads(line) for line in log.read_text().splitlines()]

    return script, str(tmp_path / "prefix"), runs


def test_marin_run_set_reaches_the_script_and_moves_only_the_changed_values(settings_script, capsys):
    script, prefix, runs = settings_script
    overrides = ["--set", "train.num_train_steps=3", "--set", "train.learning_rate=0.01"]
    assert cli.main(["run", str(script), "--prefix", prefix]) == 0
    assert cli.main(["run", str(script), "--prefix", prefix, *overrides]) == 0
    assert cli.main(["run", str(script), "--prefix", prefix, *overrides]) == 0
    default, changed, again = runs()
    assert default["settings"] == {"num_train_steps": 10, "learning_rate": 0.001, "seed": 0}
    assert changed["settings"] == {"num_train_steps": 3, "learning_rate": 0.01, "seed": 0}
    assert changed["hash"] != default["hash"] and changed["ran"] == ["train/model"]
    assert again["hash"] == changed["hash"] and again["ran"] == [] and again["cached"] == ["train/model"]

    capsys.readouterr()
    assert cli.main(["explain", "train/model", "train/model", "--prefix", prefix, "--json"]) == 0
    differences = json.loads(capsys.readouterr().out)["differences"]
    assert any("num_train_steps" in line and "10" in line and "3" in line for line in differences), differences
    assert any("learning_rate" in line and "0.001" in line and "0.01" in line for line in differences), differences
    assert not any("seed" in line for line in differences)


def test_marin_run_config_file_then_set(settings_script, tmp_path):
    script, prefix, runs = settings_script
    (tmp_path / "train.yaml").write_text("num_train_steps: 5\nlearning_rate: 0.2\n")
    args = ["run", str(script), "--prefix", prefix, "--config", "train=train.yaml", "--set", "train.learning_rate=0.3"]
    assert cli.main(args) == 0
    assert runs()[-1]["settings"] == {"num_train_steps": 5, "learning_rate": 0.3, "seed": 0}


def test_marin_run_refuses_settings_the_script_never_read_or_cannot_apply(settings_script, capsys):
    script, prefix, _ = settings_script
    assert cli.main(["run", str(script), "--prefix", prefix, "--set", "trian.learning_rate=0.1"]) == 2
    assert "settings were given for trian" in capsys.readouterr().err

    assert cli.main(["run", str(script), "--prefix", prefix, "--set", "train.learning_rat=0.1"]) == 2
    assert "Did you mean 'learning_rate'" in capsys.readouterr().err

    assert cli.main(["run", str(script), "--prefix", prefix, "--set", "train.num_train_steps=many"]) == 2
    assert "expected int" in capsys.readouterr().err

    assert cli.main(["run", str(script), "--prefix", prefix, "--set", "learning_rate=0.1"]) == 2
    assert "NAME.KEY=VALUE" in capsys.readouterr().err


def test_a_duplicate_key_in_a_config_file_is_refused_naming_the_key_and_both_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("num_train_steps: 5\noptimizer:\n  learning_rate: 0.1\n  schedule: linear\n  learning_rate: 0.2\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: the key 'optimizer\.learning_rate' appears twice, on lines 3 and 5"):
        load_config(Run, str(path))
    top = tmp_path / "top.yaml"
    top.write_text("num_train_steps: 5\nname: a\nnum_train_steps: 6\n")
    with pytest.raises(ConfigError, match=r"'num_train_steps' appears twice, on lines 1 and 3"):
        load_config(Run, str(top))


def test_yaml_merge_keys_may_still_override_merged_values(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {learning_rate: 0.1, schedule: linear}\n")
    # a merge key is YAML's own way of overriding: not a duplicate
    data = "optimizer:\n  <<: {learning_rate: 0.1, schedule: linear}\n  learning_rate: 0.2\n"
    path.write_text(data)
    assert load_config(Run, str(path)).optimizer == Optim(learning_rate=0.2, schedule=Schedule.LINEAR)


ALIAS_BOMB = (
    'data: [&a ["x","x","x","x","x","x","x","x","x"],\n'
    "  &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b],\n"
    "  &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d],\n"
    "  &f [*e,*e,*e,*e,*e,*e,*e,*e,*e], &g [*f,*f,*f,*f,*f,*f,*f,*f,*f],\n"
    "  [*g,*g,*g,*g,*g,*g,*g,*g,*g]]\n"
)


@dataclasses.dataclass(frozen=True)
class Loose:
    data: Any = None


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    # 9**8 = 43 million strings once expanded (hashing or printing the value hangs), from 285 bytes
    with pytest.raises(ConfigError, match=r"bomb\.yaml.*aliases.*more than 100,000 values"):
        load_config(Loose, str(path))


def test_a_few_aliases_are_still_read(tmp_path):
    path = tmp_path / "alias.yaml"
    path.write_text("optimizer: &o {learning_rate: 0.25}\nwarm_start: *o\n")
    config = load_config(Run, str(path))
    assert config.optimizer == config.warm_start == Optim(learning_rate=0.25)


def test_a_config_file_larger_than_the_limit_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("name: " + "x" * (1024 * 1024 + 1) + "\n")
    with pytest.raises(ConfigError, match=r"huge\.yaml is 1,048,584 bytes; config files are limited to 1,048,576"):
        load_config(Run, str(path))


@dataclasses.dataclass(frozen=True)
class CheckedOptim:
    learning_rate: float = 1e-3

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"CheckedOptim.learning_rate must be > 0; got {self.learning_rate!r}.")


@dataclasses.dataclass(frozen=True)
class CheckedRun:
    steps: int = 10
    optimizer: CheckedOptim = dataclasses.field(default_factory=CheckedOptim)


def test_a_value_refused_by_a_nested_configs_own_check_is_a_config_error_naming_the_setting(tmp_path):
    with pytest.raises(ConfigError, match=r"Bad value for 'optimizer\.learning_rate': CheckedOptim\.learning_rate must be > 0"):
        apply_overrides(CheckedRun(), ["optimizer.learning_rate=-1"])
    path = tmp_path / "neg.yaml"
    path.write_text("optimizer:\n  learning_rate: -1\n")
    with pytest.raises(ConfigError, match=r"neg\.yaml: optimizer\.learning_rate.*must be > 0"):
        load_config(CheckedRun, str(path))


def test_marin_run_reports_a_value_a_nested_config_refuses_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    from levanter.optim import AdamConfig  # a real nested config with its own check

    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent(
        """
        import dataclasses
        from levanter.optim import AdamConfig
        from marin.experiment.config import script_config

        @dataclasses.dataclass(frozen=True)
        class Settings:
            optimizer: AdamConfig = dataclasses.field(default_factory=lambda: AdamConfig(learning_rate=1e-3))

        script_config(Settings, "train")
        """
    ))
    assert AdamConfig(learning_rate=1e-3).learning_rate == 1e-3
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", str(script), "--prefix", str(tmp_path / "p"), "--set", "train.optimizer.learning_rate=-1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("marin run:")]
    assert len(lines) == 1 and "optimizer.learning_rate" in lines[0] and "must be a finite number > 0" in lines[0], err


def test_a_setting_for_a_name_the_script_never_read_is_refused_before_its_steps_run(settings_script, capsys):
    script, prefix, runs = settings_script
    assert cli.main(["run", str(script), "--prefix", prefix, "--set", "trian.learning_rate=0.1"]) == 2
    err = capsys.readouterr().err
    assert "settings were given for trian" in err and "nothing was run" in err and "Traceback" not in err
    # The script's run raised before planning: its step never ran and it logged nothing after.
    assert not Path(prefix).exists()
    assert not Path(os.environ["SETTINGS_LOG"]).exists()


LONG_INTEGER = "9" * 5000  # past Python's 4,300-digit limit on turning text into an int


def _one_line_refusal(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("marin run:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("text, words", [
    (f"num_train_steps: {LONG_INTEGER}\n", "line 1: an integer of 5,000 digits"),
    (f"name: {LONG_INTEGER}\n", "line 1: an integer of 5,000 digits"),
    ("name: a\nnum_train_steps: 0x" + "f" * 4000 + "\n", "line 2: an integer of 4,817 digits"),
    ("name: 2024-13-45\n", "line 1: '2024-13-45' cannot be read as a date (month must be in 1..12)"),
    ("seed: !!int 'ten'\n", "line 1: 'ten' cannot be read as an integer"),
    ("name: [a\n", "is not valid YAML: expected ',' or ']', but got '<stream end>' (line 2, column 1)"),
])
def test_a_config_file_value_yaml_cannot_read_is_one_line_with_exit_2(settings_script, tmp_path, capsys, text, words):
    script, prefix, _ = settings_script
    (tmp_path / "train.yaml").write_text(text)
    with pytest.raises(ConfigError, match="train.yaml") as error:
        load_config(Run, str(tmp_path / "train.yaml"))
    assert words in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert cli.main(["run", str(script), "--prefix", prefix, "--config", "train=train.yaml"]) == 2
    assert words in _one_line_refusal(capsys.readouterr().err)


@pytest.mark.parametrize("value, words", [
    (LONG_INTEGER, "an integer of 5,000 digits"),
    ("2024-13-45", "cannot be read as a date"),
])
def test_an_override_yaml_cannot_read_is_one_line_with_exit_2(settings_script, capsys, value, words):
    script, prefix, _ = settings_script
    assert cli.main(["run", str(script), "--prefix", prefix, "--set", f"train.seed={value}"]) == 2
    line = _one_line_refusal(capsys.readouterr().err)
    assert "Override 'seed'" in line and words in line and len(line) < 400, line
    with pytest.raises(ConfigError, match=words):
        apply_overrides(Run(), [f"seed={value}"])


def _make_dangling(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere.yaml")


@pytest.mark.parametrize("make, words", [
    (lambda path: path.mkdir(), "is not a regular file (a folder)"),
    (_make_dangling, "is a link to a file that does not exist"),
    (lambda path: path.write_bytes(b"name: caf\xe9\n"), "is not UTF-8 text (byte 9)"),
    (lambda path: path.write_text("name: " + "x" * (2 << 20)), "config files are limited to 1,048,576 bytes"),
])
def test_a_config_path_that_is_no_readable_settings_file_is_one_line_with_exit_2(settings_script, tmp_path, capsys,
                                                                                  make, words):
    script, prefix, _ = settings_script
    make(tmp_path / "t")
    assert cli.main(["run", str(script), "--prefix", prefix, "--config", "train=t"]) == 2
    line = _one_line_refusal(capsys.readouterr().err)
    assert "Config file t " in line and words in line, line


def test_a_fifo_as_the_config_file_is_refused_without_waiting_for_a_writer(settings_script, tmp_path):
    import subprocess
    import sys

    script, prefix, _ = settings_script
    os.mkfifo(tmp_path / "fifo.yaml")
    # In a child process with a timeout: reading a FIFO nobody writes to would wait forever.
    done = subprocess.run([sys.executable, "-m", "marin.cli", "run", str(script), "--prefix", prefix,
                           "--config", "train=fifo.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Config file fifo.yaml is not a regular file (a FIFO)" in _one_line_refusal(done.stderr)


# -- a family of configs chosen by name (optimizers) ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _WithOptimizer:
    optimizer: OptimizerConfig = dataclasses.field(default_factory=lambda: AdamConfig(learning_rate=6e-4, weight_decay=0.1))


def test_a_type_key_chooses_the_optimizer_and_dumped_settings_read_back(tmp_path):
    path = tmp_path / "muon.yaml"
    path.write_text("optimizer:\n  type: muon\n  learning_rate: 0.02\n  adam_learning_rate: 3e-3\n")
    settings = load_config(_WithOptimizer, str(path))
    assert settings.optimizer == MuonConfig(learning_rate=0.02, adam_learning_rate=3e-3)
    assert "type: muon" in dump_config(settings)
    (tmp_path / "dumped.yaml").write_text(dump_config(settings))
    assert load_config(_WithOptimizer, str(tmp_path / "dumped.yaml")) == settings


OPTIMIZER_SCRIPT = """
import os
from marin.experiment.config import dump_config, script_config
from test_experiment_config import _WithOptimizer

with open(os.environ["SETTINGS_OUT"], "w") as out:
    out.write(dump_config(script_config(_WithOptimizer, "opt")))
"""


def test_a_config_file_with_another_type_replaces_the_default_and_one_without_updates_it(tmp_path, monkeypatch):
    script = tmp_path / "opt_script.py"
    script.write_text(OPTIMIZER_SCRIPT)
    monkeypatch.setenv("SETTINGS_OUT", str(tmp_path / "out.yaml"))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    (tmp_path / "lion.yaml").write_text("optimizer:\n  type: lion\n  learning_rate: 1e-4\n")
    (tmp_path / "adam.yaml").write_text("optimizer:\n  beta2: 0.99\n")

    def settings_after(config_file: str) -> _WithOptimizer:
        assert cli.main(["run", str(script), "--prefix", str(tmp_path / "prefix"), "--config", f"opt={config_file}"]) == 0
        return load_config(_WithOptimizer, str(tmp_path / "out.yaml"))

    # Another member is built anew from the file: AdamConfig's weight decay is not carried over.
    assert settings_after(str(tmp_path / "lion.yaml")).optimizer == LionConfig(learning_rate=1e-4)
    assert settings_after(str(tmp_path / "adam.yaml")).optimizer == AdamConfig(6e-4, 0.1, beta2=0.99)


def test_set_type_switches_the_optimizer_keeping_the_shared_settings():
    switched = apply_overrides(_WithOptimizer(), ["optimizer.type=lion", "optimizer.beta2=0.98"])
    assert switched.optimizer == LionConfig(learning_rate=6e-4, weight_decay=0.1, beta2=0.98)


def test_an_unknown_or_missing_optimizer_type_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"'optimizer.type': 'sgd' is not a OptimizerConfig; choose one of .*adam.*muon"):
        apply_overrides(_WithOptimizer(), ["optimizer.type=sgd"])
    untyped = tmp_path / "untyped.yaml"
    untyped.write_text("optimizer:\n  learning_rate: 0.02\n")
    with pytest.raises(ConfigError, match=r"optimizer needs a 'type' key naming which OptimizerConfig \(one of .*adam"):
        load_config(_WithOptimizer, str(untyped))
    narrow = dataclasses.make_dataclass("Narrow", [("optimizer", AdamConfig)], frozen=True)
    with pytest.raises(ConfigError, match=r"'muon' is not a AdamConfig; choose one of adam"):
        apply_overrides(narrow(AdamConfig(1e-3)), ["optimizer.type=muon"])
