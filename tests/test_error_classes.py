"""Every package's errors derive from that package's base class, and the step runner decides by
type alone whether a failure is shown as its message or with its traceback."""

import importlib
import inspect
import logging
import os
import pkgutil

import pytest

from rigging.errors import ExplainedError

BASES = {
    "rigging": "rigging.errors.RiggingError",
    "haliax": "haliax.errors.HaliaxError",
    "fray": "fray.errors.FrayError",
    "iris": "iris.errors.IrisError",
    "zephyr": "zephyr.errors.ZephyrError",
    "levanter": "levanter.errors.LevanterError",
    "marin": "marin.errors.MarinError",
    "infra": "infra.errors.InfraError",
}
# The root every base derives from, and how a preempted run exits (not an error: SystemExit with
# the preemption exit code).
NOT_ERRORS = {"rigging.errors.ExplainedError", "marin.execution.ownership.interrupts.RunPreempted"}


def _resolve(dotted: str) -> type:
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _exception_classes(package: str) -> dict[str, type]:
    found = {}
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (the Ray client without Ray)
            continue
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = value
    return found


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_exception_class_of_a_package_derives_from_its_base(package):
    base = _resolve(BASES[package])
    assert issubclass(base, ExplainedError)
    classes = _exception_classes(package)
    assert len(classes) >= 2  # the walk found the package's errors, not nothing
    strays = sorted(name for name, cls in classes.items() if not issubclass(cls, base) and name not in NOT_ERRORS)
    assert strays == [], f"derive these from {BASES[package]}: {strays}"


def test_specific_errors_keep_the_builtin_kind_callers_catch():
    from fray.cluster import UnschedulableError
    from levanter.tokenization.loading import TokenizerNotFoundError
    from marin.execution.hashing.identity import InvalidStepError

    assert issubclass(InvalidStepError, ValueError)
    assert issubclass(UnschedulableError, ValueError)
    assert issubclass(TokenizerNotFoundError, FileNotFoundError)


def _step_failure_log(tmp_path, caplog, error: BaseException) -> str:
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    def fail():
        raise error

    caplog.set_level(logging.INFO)
    StepRunner(prefix=str(tmp_path)).run([StepSpec(name="fails", fn=fail)], raise_on_failure=False)
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("marin.execution"))


def test_a_project_error_of_any_builtin_kind_is_shown_as_its_message(tmp_path, caplog):
    from levanter.errors import LevanterError

    class ExampleRuntimeFailure(LevanterError, RuntimeError):
        pass

    log = _step_failure_log(tmp_path, caplog, ExampleRuntimeFailure("the checkpoint is gone; rerun from scratch"))
    assert "ExampleRuntimeFailure: the checkpoint is gone; rerun from scratch" in log
    assert "Traceback" not in log


def test_a_plain_value_error_named_like_a_project_error_still_shows_its_traceback(tmp_path, caplog):
    # The decision is by type: a class defined in a module of a project package but not derived
    # from a package base is not "explained" (it used to be, by its module's name).
    SneakyError = type("SneakyError", (ValueError,), {"__module__": "marin.execution.fake"})
    log = _step_failure_log(tmp_path, caplog, SneakyError("what now?"))
    assert "Traceback (most recent call last)" in log and "SneakyError: what now?" in log


def test_an_error_a_script_causes_is_one_line_under_plain_python_naming_the_script_line(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "experiment.py"
    script.write_text(
        "from levanter.models.llama import LlamaConfig\n"
        "from marin.experiment.train import train_lm\n"
        "\n"
        "model = LlamaConfig(hidden_dim=8, intermediate_dim=16, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64)\n"
        "train_lm(name='x', model=model, datasets={}, batch_size=4, seq_len=32, num_train_steps=2)\n"
    )

    def run(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})

    plain = run()
    assert plain.returncode == 1 and plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    assert plain.stderr == (f"{script}, line 5: TrainConfigError: train_lm needs at least one dataset: "
                            "datasets={tokenized(...): 1.0}. (the whole traceback: MARIN_TRACEBACK=1)\n")
    full = run(MARIN_TRACEBACK="1")
    assert full.returncode == 1 and "Traceback (most recent call last)" in full.stderr
    # A bug (any other exception) keeps its traceback.
    script.write_text("import marin\nraise KeyError('bug')\n")
    bug = run()
    assert "Traceback (most recent call last)" in bug.stderr and "KeyError: 'bug'" in bug.stderr
