"""iris end to end: real supervisors, real child processes, a real (private) Ray cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iris import PREEMPTED_EXIT_CODE, InvalidJobSpec, JobSpec, JobState, JobStore
from iris.cli import main as iris_main
from iris.jobs import JobNotFound, follow_logs, get_job, list_jobs, read_logs, stop_job, submit_job, wait_for_job
from iris.spec import resources_from_flags

TIMEOUT = 60


@pytest.fixture()
def store(tmp_path):
    store = JobStore(tmp_path / "iris")
    yield store
    # Never leave a detached supervisor behind, whatever the test did.
    for record in store.all():
        if not record.state.finished:
            stop_job(record.job_id, store, timeout=15)


def shell(script: str, **kwargs) -> JobSpec:
    return JobSpec(name=kwargs.pop("name", "sh"), command=("sh", "-c", script), **kwargs)


def run_to_end(spec: JobSpec, store: JobStore):
    job_id = submit_job(spec, store)
    record = wait_for_job(job_id, store, timeout=TIMEOUT)
    assert record.state.finished, f"job {job_id} still {record.state} after {TIMEOUT}s"
    return record


def wait_until(predicate, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_local_job_runs_to_completion_and_its_logs_can_be_followed(store):
    job_id = submit_job(shell('echo "first $IRIS_REPLICA_INDEX/$IRIS_NUM_REPLICAS"; sleep 0.5; echo second >&2'), store)
    followed = "".join(follow_logs(job_id, store, poll_s=0.05))
    record = get_job(job_id, store)
    assert record.state == JobState.SUCCEEDED and record.attempts == 1 and record.exit_code == 0
    assert followed.endswith("first 0/1\nsecond\n")
    assert read_logs(job_id, store) == "first 0/1\nsecond\n"


def test_preempted_job_is_retried_up_to_its_preemption_budget(store):
    record = run_to_end(shell(f"echo try $IRIS_ATTEMPT; exit {PREEMPTED_EXIT_CODE}", max_retries_preemption=2), store)
    assert record.state == JobState.FAILED
    assert (record.attempts, record.preemptions, record.failures) == (3, 3, 0)
    assert record.exit_code == PREEMPTED_EXIT_CODE
    logs = read_logs(record.job_id, store)
    assert [line for line in logs.splitlines() if line.startswith("try")] == ["try 1", "try 2", "try 3"]


def test_preempted_job_that_then_succeeds_ends_succeeded(store):
    script = f'if [ "$IRIS_ATTEMPT" = 1 ]; then exit {PREEMPTED_EXIT_CODE}; fi; echo done'
    record = run_to_end(shell(script, max_retries_preemption=3), store)
    assert (record.state, record.attempts, record.preemptions) == (JobState.SUCCEEDED, 2, 1)


def test_sigterm_from_outside_counts_as_preemption(store):
    record = run_to_end(shell("kill -TERM $$", max_retries_preemption=1), store)
    assert (record.state, record.attempts, record.preemptions, record.failures) == (JobState.FAILED, 2, 2, 0)


def test_plain_failure_is_not_retried_beyond_its_failure_budget(store):
    plain = run_to_end(shell("exit 3", max_retries_preemption=5), store)
    assert (plain.state, plain.attempts, plain.failures, plain.exit_code) == (JobState.FAILED, 1, 1, 3)
    budget = run_to_end(shell("exit 3", max_retries_failure=1, max_retries_preemption=5), store)
    assert (budget.state, budget.attempts, budget.failures, budget.preemptions) == (JobState.FAILED, 2, 2, 0)
    # A plain failure is never recorded as a preemption, even while it is being retried.
    messages = [message for _, state, message in store.events(budget.job_id) if state in ("RETRYING", "FAILED")]
    assert messages == ["attempt 1 FAILED (exit 3); iris retries it, 1 of 1 failure spent",
                        "attempt 2 FAILED (exit 3); no retries left, all 1 failure spent (max_retries_failure=1)"]


def test_a_preempted_attempts_log_ends_with_what_iris_does_next(store, tmp_path):
    # The command's own output ends in a traceback-like tail; iris's line must come after it.
    script = f'echo "try $IRIS_ATTEMPT"; echo "CANCELLED AT 12:00" >&2; exit {PREEMPTED_EXIT_CODE}'
    spec = shell(script, max_retries_preemption=1, attempts_folder=str(tmp_path / "step"))
    record = run_to_end(spec, store)
    assert (record.state, record.attempts, record.preemptions) == (JobState.FAILED, 2, 2)
    (first,) = sorted(store.log_folder(record.job_id).glob("attempt-001-replica-*.log"))
    assert first.read_text().rstrip().splitlines()[-1] == (
        "iris: this attempt ended PREEMPTED (exit 75); iris retries it, 1 of 1 preemption spent")
    # The copy in the step's folder, and its record, say the same.
    from iris.attempt_log import list_attempts, read_log

    kept = list_attempts(str(tmp_path / "step"))
    last_lines = [read_log(listing.logs[0]).decode().rstrip().splitlines()[-1] for listing in kept]
    assert last_lines == [
        "iris: this attempt ended PREEMPTED (exit 75); iris retries it, 1 of 1 preemption spent",
        "iris: this attempt ended PREEMPTED (exit 75); no retries left, all 1 preemption spent (max_retries_preemption=1)",
    ]
    assert kept[0].record.reason.endswith("; iris retries it, 1 of 1 preemption spent")
    assert get_job(record.job_id, store).message == (
        "attempt 2 PREEMPTED (exit 75); no retries left, all 1 preemption spent (max_retries_preemption=1)")


def test_a_succeeding_attempts_log_is_only_the_commands_output(store):
    record = run_to_end(shell("echo fine"), store)
    assert record.state == JobState.SUCCEEDED and read_logs(record.job_id, store) == "fine\n"


def test_stop_ends_a_running_job(store, tmp_path):
    pid_file = tmp_path / "replica.pid"
    job_id = submit_job(shell(f"echo $$ > {pid_file}; exec sleep 60"), store)
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the replica to start"))
    assert get_job(job_id, store).state == JobState.RUNNING
    assert iris_main(["--home", str(store.home), "job", "stop", job_id]) == 0
    record = get_job(job_id, store)
    assert record.state == JobState.STOPPED
    wait_until(lambda: process_gone(pid), "the replica process to end")


def test_replicas_are_all_or_nothing(store, tmp_path):
    # Attempt 1: replica 1 fails at once while replica 0 would run for a minute; the whole job restarts.
    script = (
        f'echo "r=$IRIS_REPLICA_INDEX n=$IRIS_NUM_REPLICAS c=$IRIS_COORDINATOR_ADDRESS a=$IRIS_ATTEMPT"; '
        f'if [ "$IRIS_ATTEMPT" = 1 ]; then '
        f'  if [ "$IRIS_REPLICA_INDEX" = 1 ]; then exit 1; fi; '
        f"  echo $$ > {tmp_path}/slow.pid; exec sleep 60; "
        f"fi"
    )
    record = run_to_end(shell(script, replicas=2, max_retries_failure=1), store)
    assert (record.state, record.attempts, record.failures) == (JobState.SUCCEEDED, 2, 1)
    first, second = store.attempts(record.job_id)
    assert first.outcome == "FAILED" and first.exit_codes[1] == 1 and first.exit_codes[0] != 0
    assert second.outcome == "SUCCEEDED" and second.exit_codes == (0, 0)
    slow_pid = tmp_path / "slow.pid"
    if slow_pid.exists():  # replica 0 got as far as its sleep before it was stopped
        wait_until(lambda: process_gone(int(slow_pid.read_text())), "the healthy replica to be stopped")
    logs = read_logs(record.job_id, store)
    assert "==> attempt 2, replica 1 <==" in logs
    second_attempt = [line for line in logs.splitlines() if line.startswith("r=") and line.endswith("a=2")]
    assert sorted(line.split()[0] for line in second_attempt) == ["r=0", "r=1"]
    assert {line.split()[1] for line in second_attempt} == {"n=2"}
    coordinators = {line.split()[2] for line in second_attempt}
    assert len(coordinators) == 1 and coordinators.pop().startswith("c=127.0.0.1:")


def test_the_rest_of_a_broken_gang_is_stopped_together_not_one_after_another():
    # Peers of a dead replica, blocked in a collective with it, each take their whole grace period to
    # stop: one after the other, a gang of N would take N of them to end. Each stop below returns only
    # once all three have begun, so stopping them one at a time breaks the barrier instead.
    import threading

    from iris.supervisor import stop_together

    started = threading.Barrier(3, timeout=TIMEOUT)

    class BlockedReplica:
        def __init__(self, code: int) -> None:
            self.code = code

        def stop(self) -> int:
            started.wait()
            return self.code

    assert stop_together([BlockedReplica(-9), BlockedReplica(-15), BlockedReplica(75)]) == [-9, -15, 75]
    assert stop_together([]) == []


def test_a_restarted_iris_lists_earlier_jobs_with_their_final_states(tmp_path):
    home = str(tmp_path / "iris")

    def cli(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "iris.cli", "--home", home, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)

    ok = cli("job", "run", "--name", "fine", "--wait", "--", "sh", "-c", "echo ok")
    bad = cli("job", "run", "--name", "broken", "--wait", "--", "sh", "-c", "exit 4")
    assert (ok.returncode, bad.returncode) == (0, 1)
    # --wait prints the job id, then streams the job's output as it is written.
    ok_id, bad_id = ok.stdout.splitlines()[0], bad.stdout.splitlines()[0]
    assert ok.stdout.splitlines()[-1] == "ok" and f"{ok_id}: SUCCEEDED" in ok.stderr
    listing = cli("job", "list")
    assert listing.returncode == 0
    states = {line.split()[0]: line.split()[1] for line in listing.stdout.splitlines()[1:]}
    assert states == {ok_id: "SUCCEEDED", bad_id: "FAILED"}
    status = cli("job", "status", bad_id)
    assert "state:      FAILED" in status.stdout and "exit code:  4" in status.stdout
    assert cli("job", "logs", ok_id).stdout == "ok\n"
    missing = cli("job", "status", "no-such-job")
    assert missing.returncode == 2 and "no-such-job" in missing.stderr and ok_id in missing.stderr


def test_job_on_the_ray_backend_runs_to_completion_with_logs(store):
    pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")
    resources = resources_from_flags(cpu=1, memory="64m")
    spec = shell("echo hello from ray $IRIS_REPLICA_INDEX; echo and stderr >&2", backend="ray", resources=resources)
    too_big = shell("true", backend="ray", resources=resources_from_flags(cpu=1, memory="100000g"))
    one_breaks = shell(
        'if [ "$IRIS_REPLICA_INDEX" = 1 ]; then sleep 1; exit 1; fi; echo waiting; exec sleep 60',
        backend="ray", resources=resources, replicas=2,
    )
    # All three start their private Ray instances at once.
    job_id, too_big_id, breaks_id = (submit_job(s, store) for s in (spec, too_big, one_breaks))
    broken = wait_for_job(breaks_id, store, timeout=TIMEOUT)
    assert (broken.state, broken.attempts, broken.exit_code) == (JobState.FAILED, 1, 1)
    assert store.attempts(breaks_id)[0].exit_codes == (-15, 1)  # replica 0 stopped by iris
    assert "waiting" in read_logs(breaks_id, store)
    record = wait_for_job(job_id, store, timeout=TIMEOUT)
    refused = wait_for_job(too_big_id, store, timeout=TIMEOUT)
    assert refused.state == JobState.FAILED and refused.attempts == 0
    assert "no node of the Ray cluster can ever provide" in refused.message
    assert record.state == JobState.SUCCEEDED, (record.message, (store.log_folder(record.job_id) / "supervisor.log").read_text())
    assert read_logs(record.job_id, store) == "hello from ray 0\nand stderr\n"
    assert [job.job_id for job in list_jobs(store)] == [record.job_id, too_big_id, breaks_id]


def test_a_replica_whose_ray_worker_dies_counts_as_preempted_and_is_retried(store):
    pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")
    # The replica's parent is the Ray worker holding it; killing that worker is its node going away.
    script = 'if [ "$IRIS_ATTEMPT" = 1 ]; then kill -KILL $PPID; exec sleep 5; fi; echo "attempt $IRIS_ATTEMPT ok"'
    spec = shell(script, backend="ray", resources=resources_from_flags(cpu=1, memory="64m"), max_retries_preemption=1)
    record = run_to_end(spec, store)
    assert (record.state, record.attempts, record.preemptions, record.failures) == (JobState.SUCCEEDED, 2, 1, 0)
    assert store.attempts(record.job_id)[0].exit_codes == (PREEMPTED_EXIT_CODE,)
    logs = read_logs(record.job_id, store)
    assert "counted as preempted" in logs and logs.endswith("attempt 2 ok\n")


def test_invalid_jobs_are_refused_with_clear_messages(store):
    with pytest.raises(InvalidJobSpec, match="list of arguments"):
        JobSpec(name="x", command="python train.py")
    with pytest.raises(InvalidJobSpec, match="max-retries-failure"):
        shell("true", max_retries_failure=-1)
    with pytest.raises(InvalidJobSpec, match="backend"):
        shell("true", backend="kubernetes")
    with pytest.raises(InvalidJobSpec, match="VARIANT:COUNT"):
        resources_from_flags(gpu="H100:many")
    with pytest.raises(InvalidJobSpec, match="TPU"):
        resources_from_flags(tpu="v9-8")
    assert resources_from_flags(gpu="H100:8").gpu_count == 8
    with pytest.raises(JobNotFound):
        get_job("nope", store)


def test_the_database_lives_under_iris_home_or_the_marin_prefix(monkeypatch, tmp_path):
    from iris.store import IrisHomeError, default_home

    monkeypatch.setenv("IRIS_HOME", str(tmp_path / "custom"))
    assert default_home() == (tmp_path / "custom").resolve()
    monkeypatch.delenv("IRIS_HOME")
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "prefix"))
    assert default_home() == (tmp_path / "prefix").resolve() / ".iris"
    monkeypatch.setenv("MARIN_PREFIX", "gs://bucket/marin")
    with pytest.raises(IrisHomeError, match="IRIS_HOME"):
        default_home()


def test_a_tpu_slice_runs_one_replica_per_host_by_default():
    assert resources_from_flags(tpu="v4-32").replicas == 4
    spec = JobSpec(name="t", command=("true",), resources=resources_from_flags(tpu="v4-32", memory="8g"), replicas=4)
    assert JobSpec.from_json(spec.to_json()) == spec


def test_a_job_keeps_its_custom_resources_through_the_store():
    from fray.cluster import ResourceConfig

    spec = JobSpec(name="t", command=("true",), resources=ResourceConfig.with_cpu(ram="1g", custom={"trainer": 1}))
    assert JobSpec.from_json(spec.to_json()).resources.custom == (("trainer", 1.0),)


def test_replicas_join_one_jax_distributed_runtime_through_the_coordinator_address(store):
    # Two CPU processes, two simulated devices each: together they see four devices.
    program = (
        "import os, jax; "
        "jax.distributed.initialize(os.environ['IRIS_COORDINATOR_ADDRESS'], "
        "int(os.environ['IRIS_NUM_REPLICAS']), int(os.environ['IRIS_REPLICA_INDEX'])); "
        "print('process', jax.process_index(), 'of', jax.process_count(), 'devices', jax.device_count())"
    )
    env = {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    }
    record = run_to_end(JobSpec(name="jax", command=(sys.executable, "-c", program), replicas=2, env=tuple(env.items())), store)
    assert record.state == JobState.SUCCEEDED, read_logs(record.job_id, store)
    lines = sorted(line for line in read_logs(record.job_id, store).splitlines() if line.startswith("process"))
    assert lines == ["process 0 of 2 devices 4", "process 1 of 2 devices 4"]


def test_each_attempt_keeps_its_output_and_how_it_ended_in_the_attempts_folder(store, tmp_path):
    from iris.attempt_log import list_attempts, read_log

    folder = str(tmp_path / "step")
    script = 'echo "attempt $IRIS_ATTEMPT"; if [ "$IRIS_ATTEMPT" = 1 ]; then exit 75; fi'
    record = run_to_end(shell(script, max_retries_preemption=1, attempts_folder=folder), store)
    assert (record.state, record.preemptions, record.failures) == (JobState.SUCCEEDED, 1, 0)
    first, second = list_attempts(folder)
    assert [first.record.outcome, second.record.outcome] == ["PREEMPTED", "SUCCEEDED"]
    assert (first.record.job_id, first.record.job_attempt, second.record.job_attempt) == (record.job_id, 1, 2)
    assert first.record.exit_codes == (PREEMPTED_EXIT_CODE,) and "exited 75" in first.record.reason
    assert [read_log(url) for url in first.logs + second.logs] == [
        b"attempt 1\n\niris: this attempt ended PREEMPTED (exit 75); iris retries it, 1 of 1 preemption spent\n",
        b"attempt 2\n",
    ]
    # A later job on the same folder numbers its attempts after these.
    run_to_end(shell("echo again", attempts_folder=folder), store)
    assert [a.attempt for a in list_attempts(folder)] == [1, 2, 3]


def test_an_attempt_past_its_time_limit_is_ended_and_spends_the_failure_budget(store, tmp_path):
    from iris.attempt_log import list_attempts, read_log

    folder = str(tmp_path / "step")
    spec = shell("echo started; exec sleep 60", time_limit_s=1.0, max_retries_failure=1, attempts_folder=folder)
    record = run_to_end(spec, store)
    assert (record.state, record.attempts, record.preemptions, record.failures) == (JobState.FAILED, 2, 0, 2)
    assert "time limit" in record.message
    attempts = list_attempts(folder)
    assert [a.record.outcome for a in attempts] == ["TIMED_OUT", "TIMED_OUT"]
    assert "time limit" in attempts[0].record.reason
    assert read_log(attempts[0].logs[0]).startswith(b"started\n")
