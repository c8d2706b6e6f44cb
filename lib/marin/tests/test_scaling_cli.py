"""``marin scaling``: a real tiny IsoFLOP sweep end to end through the CLI, and what the command says about prefixes it cannot fit."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marin import cli
from marin.execution.records.executor_files import STATUS_RUNNING, write_info, write_status
from marin.scaling.runs import TRAINED_MODEL_TYPE, collect_runs

REPO = Path(__file__).resolve().parents[3]
SWEEP = REPO / "experiments" / "tutorials" / "isoflop_sweep.py"
# Budgets a factor of 2 apart: the nine runs train about 350 steps in all (about 690 with budgets 3x
# apart), and the shortest (w48 at 2e9) six, so that rounding to whole steps keeps every run's FLOPs
# within 10% of its budget. docs/scaling.md's test runs the same sweep (its fence's test-set words), so
# the two compile the same programs and share them through the persistent compilation cache.
TINY_SWEEP = ["--set", "sweep.budgets=[2e9, 4e9, 8e9]", "--set", "sweep.widths=[16, 32, 48]", "--set", "sweep.min_steps=3",
              "--set", "sweep.seq_len=64", "--set", "sweep.batch_size=4", "--set", "sweep.sample_count=200"]


def _marin(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # One CPU device, as on a reader's machine (the suite simulates 8, over which a batch of 4 cannot
    # split); the suite's compile flags stay.
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    return subprocess.run([sys.executable, "-m", "marin.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "XLA_FLAGS": " ".join(flags)})


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """Nine nano runs (3 budgets x 3 widths, a few steps each) on the built-in corpus, through ``marin run``."""
    root = tmp_path_factory.mktemp("scaling")
    prefix = root / "prefix"
    planned = _marin("run", str(SWEEP), "--prefix", str(prefix), "--dry-run", *TINY_SWEEP, cwd=REPO)
    assert planned.returncode == 0, planned.stderr
    # One run at a time: the three runs of a width then compile their programs once (the others read
    # them from the compilation cache), where nine at once would each compile them side by side.
    done = _marin("run", str(SWEEP), "--prefix", str(prefix), "--max-concurrent", "1", *TINY_SWEEP, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return prefix, planned.stdout


def test_the_dry_run_shows_the_grid_and_its_total_compute(tiny_sweep):
    _, planned = tiny_sweep
    points = [line for line in planned.splitlines() if "sweeps/isoflop-tinystories/" in line]
    assert len(points) == 9
    assert all("FLOPs" in line and " N " in line and " D " in line for line in points)
    # Three runs at each budget: 3 x (2e9 + 4e9 + 8e9) FLOPs, each run within half a step of its budget.
    total, to_run = map(float, re.search(r"Planned compute: (\S+) FLOPs over 9 step\(s\) that declare it; (\S+) of it "
                                         r"still to run\.", planned).groups())
    assert total == to_run and abs(total - 4.2e10) / 4.2e10 < 0.02


def test_the_sweep_runs_end_to_end_and_marin_scaling_fits_it(tiny_sweep, tmp_path, capsys):
    prefix, _ = tiny_sweep
    png = tmp_path / "scaling.png"
    done = _marin("scaling", str(prefix), "--steps", "sweeps/isoflop-tinystories/*", "--json", "--png", str(png),
                  "--bootstrap", "20", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    runs = report["runs"]
    assert len(runs) == 9 and not report["skipped"]
    assert sorted({run["budget"] for run in runs}) == [2e9, 4e9, 8e9]
    for run in runs:
        # The recorded compute is the planned budget up to rounding to whole steps (4 x 64 tokens each).
        assert abs(run["flops"] - run["budget"]) / run["budget"] < 0.1, run
        assert 0 < run["loss"] < 10 and run["name"].startswith("sweeps/isoflop-tinystories/")
    # Nine runs of a few steps each decide nothing about scaling, but both fits are attempted and
    # whatever cannot be fitted says why.
    assert report["parametric"] is not None or report["parametric_error"]
    assert report["isoflop"] is not None or "budget" in report["isoflop_error"]
    assert report["parametric"] is not None or report["isoflop"] is not None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The text report through the same entry point, in this process: the command above has run the
    # CLI end to end in a process of its own, and a second one would only import everything again.
    capsys.readouterr()
    assert cli.main(["scaling", str(prefix), "--budget", "1e12", "--bootstrap", "0"]) == 0
    text = capsys.readouterr().out
    assert "Scaling fits of 9 finished run(s)" in text
    assert "C = 1e+12 FLOPs" in text
    assert text.count("sweeps/isoflop-tinystories/") == 9


def test_a_prefix_without_runs_exits_1_saying_what_a_fit_needs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["scaling", str(tmp_path / "empty"), "--bootstrap", "0"]) == 1
    out = capsys.readouterr().out
    assert "Scaling fits of 0 finished run(s)" in out and out.count("not fitted:") == 2


def test_a_missing_prefix_or_a_bad_budget_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["scaling", str(tmp_path / "nowhere")]) == 2
    assert "there is no folder" in capsys.readouterr().err
    for budget in ("-1", "0", "nan", "1e400", "-inf"):
        assert cli.main(["scaling", str(tmp_path), f"--budget={budget}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "every --budget must be a finite positive number of FLOPs" in err, err
    # A billion refits would run for months: refused at once, saying the bound.
    assert cli.main(["scaling", str(tmp_path), "--bootstrap", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert err == "marin scaling: --bootstrap must be between 0 and 10000 refits, got 1000000000.\n"
    assert cli.main(["scaling", str(tmp_path), "--bootstrap", "-1"]) == 2


def _finished_run(prefix: Path, name: str, result: dict, budget: float | None = None, status: str = "SUCCESS") -> Path:
    identity = hashlib.sha256(name.encode()).hexdigest()  # each run a step of its own
    folder = prefix / f"{name}-{identity[:8]}"
    folder.mkdir(parents=True)
    write_info(str(folder), {"name": name, "identity": identity,
                             "annotations": {"sweep": {"budget": budget}} if budget else {}})
    write_status(str(folder), status)
    (folder / ".artifact.json").write_text(json.dumps({"result_type": TRAINED_MODEL_TYPE, "result": result}))
    return folder


def test_runs_that_cannot_be_used_are_listed_with_the_reason(tmp_path):
    prefix = tmp_path / "prefix"
    good = {"parameters": 1000, "tokens_trained": 5000, "flops_per_token": 6500.0, "validation_losses": {"a": 3.0, "b": 4.0}}
    _finished_run(prefix, "sweeps/s/good", good, budget=3e7)
    _finished_run(prefix, "sweeps/s/old", {**good, "flops_per_token": None})
    _finished_run(prefix, "sweeps/s/no-validation", {**good, "validation_losses": {}})
    _finished_run(prefix, "sweeps/s/running", good, budget=3e7, status=STATUS_RUNNING)
    _finished_run(prefix, "other/run", good)
    damaged = _finished_run(prefix, "sweeps/s/damaged", good)
    (damaged / ".artifact.json").write_text("{not json")

    fifo = _finished_run(prefix, "sweeps/s/fifo", good)
    (fifo / ".artifact.json").unlink()
    os.mkfifo(fifo / ".artifact.json")  # opening it would wait for a writer forever; it is refused instead
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"result_type": TRAINED_MODEL_TYPE, "result": good}))
    linked = _finished_run(prefix, "sweeps/s/linked-out", good)
    (linked / ".artifact.json").unlink()
    (linked / ".artifact.json").symlink_to(outside)

    found = collect_runs(str(prefix), steps="sweeps/*")
    by_name = {run.name: run for run in found.runs}
    assert set(by_name) == {"sweeps/s/good", "sweeps/s/old"}
    assert by_name["sweeps/s/good"].flops == 6500.0 * 5000 and by_name["sweeps/s/good"].budget == 3e7
    assert by_name["sweeps/s/good"].loss == 3.0  # the first validation set, unless one is named
    assert by_name["sweeps/s/old"].flops == 6 * 1000 * 5000 and by_name["sweeps/s/old"].budget is None
    reasons = {skip.name: skip.reason for skip in found.skipped}
    assert reasons["sweeps/s/no-validation"].startswith("no validation loss")
    assert reasons["sweeps/s/running"] == "not finished (status RUNNING)"
    assert "damaged" in reasons["sweeps/s/damaged"]
    assert "not a regular file (a FIFO)" in reasons["sweeps/s/fifo"]
    assert "refused" in reasons["sweeps/s/linked-out"]
    assert any("6 x parameters x tokens" in note for note in found.notes)
    assert any("2 validation sets" in note for note in found.notes)

    chosen = collect_runs(str(prefix), steps="sweeps/s/good", validation="b")
    assert [run.loss for run in chosen.runs] == [4.0]
    missing = collect_runs(str(prefix), steps="sweeps/s/good", validation="c")
    assert missing.skipped[0].reason == "no validation loss for 'c' (it has: a, b)"


def _sweep_point(prefix: Path, name: str, params: float, budget: float, loss: float, *, optimizer: str = "adam",
                 learning_rate: float = 3e-3, data: str = "0" * 64, initialize_from: str | None = None,
                 validation: str = "stories") -> Path:
    """A finished run as a sweep leaves it, with the identity settings a fit compares."""
    hash_attrs = {"model": {"__class__": "LlamaConfig", "hidden_dim": int(params // 1000), "num_layers": 4},
                  "num_train_steps": int(budget // (6 * params)), "batch_size": 4,
                  "optimizer": {"type": optimizer, "learning_rate": learning_rate}}
    if initialize_from is not None:
        hash_attrs["initialize_from"] = initialize_from
    folder = prefix / f"{name}-0123abcd"
    folder.mkdir(parents=True)
    write_info(str(folder), {"name": name, "identity": hashlib.sha256(name.encode()).hexdigest(), "version": "v1", "hash_attrs": hash_attrs,
                             "deps": [{"name": "tokenized/stories", "identity": data}],
                             "annotations": {"sweep": {"budget": budget}}})
    write_status(str(folder), "SUCCESS")
    result = {"parameters": params, "tokens_trained": budget / (6 * params), "flops_per_token": 6 * params,
              "validation_losses": {validation: loss}}
    (folder / ".artifact.json").write_text(json.dumps({"result_type": TRAINED_MODEL_TYPE, "result": result}))
    return folder


def test_runs_that_differ_in_more_than_size_and_budget_are_refused_naming_what_differs(tmp_path, capsys):
    prefix = tmp_path / "prefix"
    for budget in (1e13, 1e14, 1e15):
        for params in (1e4, 2e4, 4e4, 8e4):
            _sweep_point(prefix, f"sweeps/a/{budget:.0e}/{params:.0e}", params, budget, 2 + 300 / (budget / 6 / params) ** 0.3)
    odd = {
        "sweeps/b/muon": {"optimizer": "muon"},
        "sweeps/b/hot": {"learning_rate": 1e-2},
        "sweeps/b/other-data": {"data": "f" * 64},
        "sweeps/b/warm": {"initialize_from": "olmo-2"},
        "sweeps/b/other-set": {"validation": "c4"},
    }
    for name, change in odd.items():
        _sweep_point(prefix, name, 2e4, 1e14, 2.5, **change)

    found = collect_runs(str(prefix))
    assert len(found.runs) == 12 and all(run.name.startswith("sweeps/a/") for run in found.runs)
    reasons = {skip.name: skip.reason for skip in found.skipped}
    assert set(reasons) == set(odd)
    assert all(reason.startswith("differs from the 12 run(s) fitted in more than size and budget: ") for reason in reasons.values())
    assert 'optimizer.type ("muon", theirs "adam")' in reasons["sweeps/b/muon"]
    assert 'optimizer.learning_rate (0.01, theirs 0.003)' in reasons["sweeps/b/hot"]
    assert 'dependency tokenized/stories ("ffffffff", theirs "00000000")' in reasons["sweeps/b/other-data"]
    assert 'initialize_from ("olmo-2", theirs (not set))' in reasons["sweeps/b/warm"]
    assert 'validation set ("c4", theirs "stories")' in reasons["sweeps/b/other-set"]
    # Size and budget alone never set a run apart.
    assert not any("hidden_dim" in reason or "num_train_steps" in reason for reason in reasons.values())

    mixed = collect_runs(str(prefix), mixed=True)
    assert len(mixed.runs) == 17 and not mixed.skipped and any("--mixed" in note for note in mixed.notes)

    assert cli.main(["scaling", str(prefix), "--bootstrap", "0", "--budget", "1e16"]) == 0
    out = capsys.readouterr().out
    assert "Scaling fits of 12 finished run(s)" in out
    assert 'not used: sweeps/b/muon: differs from the 12 run(s) fitted' in out


def test_the_report_says_what_a_degenerate_sweep_cannot_tell_and_prints_no_optimum_for_it(tmp_path, capsys):
    # Loss does not depend on size: no fit can say which size spends a budget best.
    prefix = tmp_path / "prefix"
    for budget in (1e13, 1e14, 1e15):
        for params in (1e4, 2e4, 4e4, 8e4):
            _sweep_point(prefix, f"sweeps/flat/{budget:.0e}/{params:.0e}", params, budget, 2 + 300 / (budget / 6 / params) ** 0.3)
    assert cli.main(["scaling", str(prefix), "--bootstrap", "20", "--budget", "1e16"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"alpha  = \S+ .*not identified: A/N\^alpha changes by less than 0\.1% of the loss", out)
    assert "C = 1e+16 FLOPs (parametric): not identified (A and alpha: A/N^alpha changes" in out
    assert "no optimum given" in out
    assert not re.search(r"\(parametric\): N = ", out)

    assert cli.main(["scaling", str(prefix), "--bootstrap", "20", "--budget", "1e16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parametric"]["alpha"]["unidentified"].startswith("A/N^alpha changes")
    (row,) = report["optimal"]
    assert "params" not in row["parametric"] and row["parametric"]["unidentified"]
    assert row["parametric"]["beyond_largest_budget"] == pytest.approx(10.0)


def test_a_run_folder_linked_out_of_the_prefix_is_listed_as_refused_and_a_copy_is_counted_once(tmp_path):
    prefix = tmp_path / "prefix"
    good = {"parameters": 1000, "tokens_trained": 5000, "flops_per_token": 6500.0, "validation_losses": {"a": 3.0}}
    original = _finished_run(prefix, "sweeps/s/good", good, budget=3e7)
    elsewhere = _finished_run(tmp_path / "elsewhere", "sweeps/s/whole", good, budget=3e7)
    (prefix / "sweeps" / "s" / elsewhere.name).symlink_to(elsewhere, target_is_directory=True)
    shutil.copytree(original, prefix / "sweeps" / "s" / "good-copied")  # a backup beside it

    found = collect_runs(str(prefix), steps="sweeps/*")
    assert [(run.name, run.path) for run in found.runs] == [("sweeps/s/good", str(original))]
    reasons = {skip.path: skip.reason for skip in found.skipped}
    assert reasons == {
        str(prefix / "sweeps" / "s" / elsewhere.name): f"refused: the folder is a link to a place outside {prefix}",
        str(prefix / "sweeps" / "s" / "good-copied"): f"a copy of {original} (the same step identity); counted once",
    }
    # Whichever is met first, the folder the identity names is the one counted.
    (prefix / "sweeps" / "s" / "good-copied").rename(prefix / "sweeps" / "s" / "a-copy")
    again = collect_runs(str(prefix), steps="sweeps/*")
    assert [run.path for run in again.runs] == [str(original)]
    assert collect_runs(str(prefix), steps="other/*").skipped == []  # the glob applies to the refused link too


def test_an_isoflop_sweep_that_leaves_two_sizes_is_refused_in_one_line(tmp_path):
    narrow = ["sweep.widths=[16, 32]" if arg.startswith("sweep.widths=") else arg for arg in TINY_SWEEP]
    done = _marin("run", str(SWEEP), "--prefix", str(tmp_path / "prefix"), "--dry-run", *narrow, cwd=REPO)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("marin run:")]
    assert len(errors) == 1 and "SweepError" in errors[0] and "needs three sizes" in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
