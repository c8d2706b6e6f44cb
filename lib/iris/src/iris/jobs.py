"""The iris job API behind the CLI: submit, look up, wait for, stop, and read the logs of jobs."""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from rigging.log import get_logger
from rigging.secrets import split_secrets

from iris.errors import IrisError
from iris.placement import signal_supervisor, start_supervisor, supervisor_alive
from iris.spec import JobSpec
from iris.store import JobRecord, JobState, JobStore

logger = get_logger(__name__)


class JobNotFound(IrisError, KeyError):
    """No job with that id in this iris database."""

    def __str__(self) -> str:
        return str(self.args[0])


def _store(store: JobStore | None) -> JobStore:
    return store if store is not None else JobStore()


def submit_job(spec: JobSpec, store: JobStore | None = None) -> str:
    """Record ``spec`` as a new PENDING job, start its supervisor where the engine keeps it alive
    (:mod:`iris.placement`), and return the job id.

    The record names the job's secret variables but holds none of their values (``JobSpec.to_json``):
    they reach the supervisor in its process environment only (on Slurm through a private file its
    node deletes once read), and from it the replicas.
    """
    store = _store(store)
    _, secrets = split_secrets(dict(spec.env))
    job_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    store.create(job_id, spec)
    store.log_folder(job_id).mkdir(parents=True, exist_ok=True)
    try:
        start_supervisor(spec, store, job_id, secrets)
    except Exception as exc:
        store.transition(job_id, JobState.FAILED, f"its supervisor could not be started: {exc}")
        raise
    logger.info("Job %s submitted (%s backend, %d replica(s))", job_id, spec.backend, spec.replicas)
    return job_id


def _reconcile(store: JobStore, record: JobRecord) -> JobRecord:
    """A job whose supervisor died without writing a final state is marked FAILED (it cannot progress)."""
    if record.state.finished or (record.supervisor_pid is None and record.supervisor_job is None) or supervisor_alive(record):
        return record
    # Re-read: the supervisor may have written its final state just before exiting.
    fresh = store.get(record.job_id)
    if fresh is None or fresh.state.finished:
        return fresh or record
    state = JobState.STOPPED if fresh.stop_requested else JobState.FAILED
    where = f"the engine's job {record.supervisor_job}" if record.supervisor_job else f"pid {record.supervisor_pid}"
    store.transition(record.job_id, state, f"supervisor ({where}) is gone; see its log in {store.log_folder(record.job_id)}")
    return store.get(record.job_id) or record


def get_job(job_id: str, store: JobStore | None = None) -> JobRecord:
    store = _store(store)
    record = store.get(job_id)
    if record is None:
        known = [r.job_id for r in store.all()[-5:]]
        hint = f" Recent jobs: {', '.join(known)}." if known else " There are no jobs yet."
        raise JobNotFound(f"No job {job_id!r} in {store.db_path}.{hint} (`iris job list` shows them all.)")
    return _reconcile(store, record)


def list_jobs(store: JobStore | None = None) -> list[JobRecord]:
    store = _store(store)
    return [_reconcile(store, record) for record in store.all()]


def wait_for_job(job_id: str, store: JobStore | None = None, timeout: float | None = None, poll_s: float = 0.1) -> JobRecord:
    """Block until the job is finished (or ``timeout`` seconds pass) and return its record."""
    store = _store(store)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        record = get_job(job_id, store)
        if record.state.finished or (deadline is not None and time.monotonic() >= deadline):
            return record
        time.sleep(poll_s)


def stop_job(job_id: str, store: JobStore | None = None, timeout: float = 30.0) -> JobRecord:
    """Ask the job's supervisor to stop its replicas; wait until the job is STOPPED (or finished)."""
    store = _store(store)
    record = get_job(job_id, store)
    if record.state.finished:
        return record
    store.request_stop(job_id)
    signal_supervisor(record)
    return wait_for_job(job_id, store, timeout=timeout)


def _log_files(store: JobStore, job_id: str) -> list[Path]:
    return sorted(store.log_folder(job_id).glob("attempt-*-replica-*.log"))


def _header(path: Path) -> str:
    _, attempt, _, replica = path.stem.split("-")
    return f"==> attempt {int(attempt)}, replica {int(replica)} <==\n"


def read_logs(job_id: str, store: JobStore | None = None) -> str:
    """Everything the job's replicas wrote, attempt by attempt (headers when there is more than one file)."""
    store = _store(store)
    get_job(job_id, store)
    files = _log_files(store, job_id)
    texts = [path.read_bytes().decode("utf-8", errors="replace") for path in files]
    if len(files) == 1:
        return texts[0]
    return "".join(_header(path) + text + ("" if text.endswith("\n") or not text else "\n") for path, text in zip(files, texts))


def follow_logs(job_id: str, store: JobStore | None = None, poll_s: float = 0.2) -> Iterator[str]:
    """Yield the job's output as it is written, until the job is finished and everything is shown."""
    store = _store(store)
    get_job(job_id, store)
    offsets: dict[Path, int] = {}
    # One decoder per file, so a character split across two reads is not garbled.
    decoders: dict[Path, codecs.IncrementalDecoder] = {}
    current: Path | None = None
    while True:
        finished = get_job(job_id, store).state.finished  # read before the files, so nothing is missed
        for path in _log_files(store, job_id):
            with open(path, "rb") as handle:
                handle.seek(offsets.get(path, 0))
                chunk = handle.read()
            if not chunk:
                continue
            offsets[path] = offsets.get(path, 0) + len(chunk)
            if path != current:
                current = path
                yield _header(path)
            decoder = decoders.setdefault(path, codecs.getincrementaldecoder("utf-8")(errors="replace"))
            yield decoder.decode(chunk)
        if finished:
            return
        time.sleep(poll_s)
