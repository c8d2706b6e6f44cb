"""The iris command's edges: bare ``iris`` and ``iris job`` say what there is to run, ``--version``
answers, and reading (``job list``, ``status``, ``logs``) never creates iris's folder."""

import pytest

from iris.cli import main
from iris.spec import JobSpec
from iris.store import JobStore


@pytest.mark.parametrize("argv, names", [([], ["job", "jobs: run, list, status, logs, stop"]),
                                         (["job"], ["run", "list", "status", "logs", "stop"])])
def test_a_command_without_its_subcommand_prints_what_there_is_to_run(argv, names, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: iris") and "required" not in err
    assert all(name in err for name in names), err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("iris ") and len(out.split()) == 2


def test_reading_an_iris_home_that_does_not_exist_creates_nothing(tmp_path, capsys):
    home = tmp_path / "prefix" / ".iris"
    assert main(["--home", str(home), "job", "list"]) == 0
    assert "No jobs yet" in capsys.readouterr().out
    assert main(["--home", str(home), "job", "status", "train-1"]) == 2
    assert main(["--home", str(home), "job", "logs", "train-1"]) == 2
    assert main(["--home", str(home), "job", "stop", "train-1"]) == 2
    assert "No job 'train-1'" in capsys.readouterr().err
    assert not (tmp_path / "prefix").exists()


def test_a_store_for_reading_sees_the_jobs_once_the_database_exists(tmp_path):
    home = tmp_path / "iris"
    assert JobStore(home, create=False).all() == [] and not home.exists()
    JobStore(home).create("t-1", JobSpec(name="t", command=("true",)))  # a writer creates the database
    assert [record.job_id for record in JobStore(home, create=False).all()] == ["t-1"]
