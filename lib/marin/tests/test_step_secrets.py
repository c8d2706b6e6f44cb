"""Credentials reach a step's replicas, and are kept nowhere: not in the step's folder, not in iris's
database or logs, not in what ``marin serve`` answers."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from fray.cluster import ResourceConfig, ship_by_value
from iris.attempt_log import list_attempts, read_log
from marin.execution.artifact import current_provenance
from marin.execution.step_runner import StepRunner
from marin.execution.step_spec import StepSpec

ship_by_value(__name__)

SECRETS = {
    "WANDB_API_KEY": "wandb-secret-value-123",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value-456",
    "HF_TOKEN": "hf-secret-value-789",
    "MARIN_TEST_LICENSE": "custom-secret-value-0ab",  # a secret only because MARIN_SECRET_NAMES says so
}


# The step function is shipped by value into the step's folder (``.executions/``): it checks digests,
# so that the values it checks for are not in that folder before the step even runs.
DIGESTS = {name: hashlib.sha256(value.encode()).hexdigest() for name, value in SECRETS.items()}


def uses_credentials(ctx):
    missing = [name for name, digest in DIGESTS.items()
               if hashlib.sha256(os.environ.get(name, "").encode()).hexdigest() != digest]
    assert not missing, f"secrets missing in the replica: {missing}"
    # A careless step prints its credentials; the kept log must not show them.
    print("credentials present:", os.environ["WANDB_API_KEY"], os.environ["HF_TOKEN"])
    print(f"the license is {os.environ['MARIN_TEST_LICENSE']}, the aws key {os.environ['AWS_SECRET_ACCESS_KEY']}")
    return {"ok": True}


def _files_holding(folder: Path, needle: bytes) -> list[str]:
    return sorted(str(path) for path in folder.rglob("*") if path.is_file() and needle in path.read_bytes())


@pytest.fixture
def secret_environment(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MARIN_SECRET_NAMES", "MARIN_TEST_LICENSE")


# Through iris (a job, its supervisor, a replica process), in the runner's threads, in its worker processes.
@pytest.mark.parametrize("cluster", ["iris:local", "local", "local:processes"])
def test_a_steps_credentials_reach_it_and_land_in_no_record_log_or_page(tmp_path, monkeypatch, secret_environment, cluster):
    _run_and_look_for_leaks(tmp_path, monkeypatch, cluster)


def test_a_steps_credentials_reach_its_slurm_job_and_stay_in_no_job_folder(slurm_cluster, tmp_path, monkeypatch,
                                                                            secret_environment):
    for name, value in slurm_cluster.env.items():  # SLURM_CONF: this process submits the job
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FRAY_SLURM_DIR", str(tmp_path / "slurm-jobs"))
    _run_and_look_for_leaks(tmp_path, monkeypatch, "iris:slurm")


def _run_and_look_for_leaks(tmp_path: Path, monkeypatch, cluster: str) -> None:
    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "iris-home"))
    prefix = tmp_path / "prefix"
    step = StepSpec("uses-credentials", uses_credentials, resources=ResourceConfig.with_cpu(cpu=1, ram="256m"))
    report = StepRunner(prefix=str(prefix), cluster=cluster).run([step])
    outcome = report.outcome_of("uses-credentials")
    assert outcome.result == {"ok": True}, outcome.error

    (attempt,) = list_attempts(outcome.output_path)
    log = read_log(attempt.logs[0]).decode()
    assert "credentials present: *** ***" in log and "the license is ***, the aws key ***" in log

    leaks = {name: _files_holding(tmp_path, value.encode()) for name, value in SECRETS.items()}
    assert leaks == {name: [] for name in SECRETS}

    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient
    from marin.serve.app import create_app

    client = TestClient(create_app(str(prefix)))
    (row,) = client.get("/api/steps").json()["steps"]
    answers = [client.get("/api/steps").text, client.get("/").text]
    for route in ("/api/step", "/step", "/api/attempts"):
        answers.append(client.get(route, params={"path": row["path"]}).text)
    for route in ("/api/log", "/log"):
        answers.append(client.get(route, params={"path": row["path"], "attempt": 1}).text)
    assert "credentials present" in answers[-2]
    assert [name for name, value in SECRETS.items() if any(value in answer for answer in answers)] == []


def test_provenance_keeps_no_secret_given_on_the_command_line(monkeypatch, secret_environment):
    monkeypatch.setattr("sys.argv", ["train.py", "--set", f"wandb.key={SECRETS['WANDB_API_KEY']}",
                                     "--hf-token", "hf-not-in-the-environment", "--steps", "10"])
    argv = current_provenance(step="train").argv
    assert argv == ("train.py", "--set", "wandb.key=***", "--hf-token", "***", "--steps", "10")


def _nothing():
    return None


def test_a_credential_copied_into_a_steps_attributes_is_not_kept_in_its_record(tmp_path, secret_environment):
    # Careless, but it happens: the key in a config. What ran is recorded; the value is not.
    step = StepSpec("careless", _nothing, hash_attrs={"wandb": {"key": SECRETS["WANDB_API_KEY"]}, "lr": 0.001})
    outcome = StepRunner(prefix=str(tmp_path / "prefix")).run([step]).outcome_of("careless")
    info = (Path(outcome.output_path) / ".executor_info").read_text()
    assert SECRETS["WANDB_API_KEY"] not in info and '"key": "***"' in info and '"lr": 0.001' in info


def fails_quoting_its_credential():
    raise ConnectionError(f"login refused for token {os.environ['HF_TOKEN']}")


def test_an_error_that_quotes_a_credential_is_kept_without_it(tmp_path, secret_environment):
    from marin.execution.records.executor_files import read_status

    report = StepRunner(prefix=str(tmp_path / "prefix")).run([StepSpec("quotes", fails_quoting_its_credential)],
                                                            raise_on_failure=False)
    outcome = report.outcome_of("quotes")
    status = read_status(outcome.output_path)
    assert status.status == "FAILED" and "login refused for token ***" in status.error
    assert SECRETS["HF_TOKEN"] not in status.error and SECRETS["HF_TOKEN"] not in outcome.error
    assert not _files_holding(tmp_path / "prefix", SECRETS["HF_TOKEN"].encode())
