"""A job's secret variables reach its replicas, while its record, its logs and its attempts folder keep
none of their values."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from iris import JobSpec, JobState, JobStore
from iris.attempt_log import AttemptLog, AttemptOutcome, list_attempts, read_log
from iris.jobs import stop_job, submit_job, wait_for_job
from iris.spec import InvalidJobSpec
from rigging.secrets import REDACTED

KEY = "wandb-0123456789abcdef"
TOKEN = "hf_0123456789abcdefXYZ"
# The replica checks it got the key by its digest: its command line is part of the job's record.
CHECK = (
    "import hashlib, os, sys\n"
    f"assert hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest() == {hashlib.sha256(KEY.encode()).hexdigest()!r}\n"
    "print('key', os.environ['WANDB_API_KEY'], 'token', os.environ['HF_TOKEN'], flush=True)\n"
    "print('token split over two writes:', os.environ['HF_TOKEN'][:6], end='', flush=True)\n"
    "sys.stdout.write(os.environ['HF_TOKEN'][6:] + '\\n')\n"
)


@pytest.fixture()
def store(tmp_path):
    store = JobStore(tmp_path / "iris")
    yield store
    for record in store.all():
        if not record.state.finished:
            stop_job(record.job_id, store, timeout=15)


def test_a_jobs_record_names_its_secret_variables_but_holds_none_of_their_values():
    spec = JobSpec(name="train", command=("python", "train.py"), env={"WANDB_API_KEY": KEY, "WANDB_PROJECT": "demo"},
                   secret_env=("HF_TOKEN",))
    assert KEY not in spec.to_json()
    stored = JobSpec.from_json(spec.to_json())
    assert dict(stored.env) == {"WANDB_PROJECT": "demo"} and stored.secret_env == ("HF_TOKEN", "WANDB_API_KEY")
    with pytest.raises(InvalidJobSpec, match="list of variable names"):
        JobSpec(name="train", command=("python",), secret_env="HF_TOKEN")


def test_a_local_jobs_replica_gets_its_secrets_and_no_file_of_iris_keeps_them(store, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # passed on by name from the submitting environment
    spec = JobSpec(name="secretive", command=(sys.executable, "-c", CHECK), env={"WANDB_API_KEY": KEY},
                   secret_env=("HF_TOKEN",), attempts_folder=str(tmp_path / "step"))
    job_id = submit_job(spec, store)
    record = wait_for_job(job_id, store, timeout=60)
    assert record.state is JobState.SUCCEEDED, (store.log_folder(job_id) / "attempt-001-replica-000.log").read_text()

    (attempt,) = list_attempts(str(tmp_path / "step"))
    kept = read_log(attempt.logs[0]).decode()
    assert kept == f"key {REDACTED} token {REDACTED}\ntoken split over two writes: {REDACTED}\n"
    assert (store.log_folder(job_id) / "attempt-001-replica-000.log").read_text() == kept
    holding = [str(path) for path in Path(tmp_path).rglob("*") if path.is_file()
               and (KEY.encode() in path.read_bytes() or TOKEN.encode() in path.read_bytes())]
    assert holding == []


def test_an_attempt_log_redacts_what_its_writer_knows_also_on_an_object_store(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    for folder in (str(tmp_path / "step"), "memory://secrets-test/step"):
        log = AttemptLog.begin(folder)
        for piece in (b"logged in as ", KEY[:4].encode(), KEY[4:].encode(), b" ok\nnow ", KEY[:9].encode()):
            log.append(0, piece)
        log.finish(AttemptOutcome.SUCCEEDED)  # what was held back as a possible key is written at the end
        assert read_log(log.log_url(0)) == f"logged in as {REDACTED} ok\nnow {KEY[:9]}".encode()
