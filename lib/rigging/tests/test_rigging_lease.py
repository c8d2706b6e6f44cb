import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from rigging.lease import Lease, LeaseRecord


def _write_record(path, **fields):
    record = {"holder": "someone", "host": socket.gethostname(), "pid": os.getpid(), "acquired_at": time.time(), "heartbeat_at": time.time()}
    record.update(fields)
    with open(path, "w") as handle:
        json.dump(record, handle)


def test_only_one_holder_and_release_frees(tmp_path):
    url = str(tmp_path / "lock")
    first, second = Lease(url, ttl_s=30), Lease(url, ttl_s=30)
    assert first.try_acquire()
    assert not second.try_acquire()
    assert first.read().holder == first.holder_id
    first.release()
    assert not os.path.exists(url)
    assert second.try_acquire()
    second.release()


def test_stale_heartbeat_is_taken_over(tmp_path):
    url = str(tmp_path / "lock")
    _write_record(url, host="another-host", pid=1, heartbeat_at=time.time() - 100)
    lease = Lease(url, ttl_s=10)
    assert lease.try_acquire()
    assert lease.read().holder == lease.holder_id
    lease.release()


def test_dead_local_holder_is_taken_over_at_once(tmp_path):
    url = str(tmp_path / "lock")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_record(url, pid=dead.pid)  # fresh heartbeat, but the process is gone
    lease = Lease(url, ttl_s=600)
    assert lease.try_acquire()
    lease.release()


def test_live_fresh_holder_is_respected(tmp_path):
    url = str(tmp_path / "lock")
    _write_record(url, host="another-host", pid=1)
    lease = Lease(url, ttl_s=600)
    assert not lease.try_acquire()
    assert lease.read().holder == "someone"


def test_holder_learns_it_lost_the_lease(tmp_path):
    url = str(tmp_path / "lock")
    lease = Lease(url, ttl_s=1, heartbeat_s=0.02)
    assert lease.try_acquire()
    deadline = time.time() + 10
    # A heartbeat already in flight may overwrite one write; the thief keeps writing as a real one would.
    while not lease.lost_event.wait(timeout=0.01) and time.time() < deadline:
        _write_record(url, holder="thief")
    assert lease.lost
    assert lease.lost and not lease.held
    lease.release()
    assert LeaseRecord.from_json(open(url).read()).holder == "thief"  # release never deletes another's lock


def test_memory_filesystem_lease():
    url = f"memory://lease-test-{os.getpid()}/lock"
    first, second = Lease(url), Lease(url)
    assert first.try_acquire() and not second.try_acquire()
    first.release()
    assert second.try_acquire()
    second.release()


# -- staleness is judged by the holder's own terms ------------------------------------------------


def test_staleness_uses_the_holders_ttl_not_the_readers(tmp_path):
    url = str(tmp_path / "lock")
    # A holder started with a 10-minute TTL whose last heartbeat is 30 s old is alive by its own terms.
    _write_record(url, host="another-host", pid=1, heartbeat_at=time.time() - 30, ttl_s=600.0, heartbeat_s=60.0)
    impatient = Lease(url, ttl_s=5)
    assert not impatient.try_acquire()
    assert impatient.read().holder == "someone"


def test_a_record_without_a_ttl_falls_back_to_the_readers(tmp_path):
    url = str(tmp_path / "lock")
    _write_record(url, host="another-host", pid=1, heartbeat_at=time.time() - 30)  # written by an older version
    lease = Lease(url, ttl_s=5)
    assert lease.try_acquire()
    lease.release()


def test_the_record_names_the_holders_ttl_heartbeat_and_process(tmp_path):
    lease = Lease(str(tmp_path / "lock"), ttl_s=120, heartbeat_s=7)
    assert lease.try_acquire()
    try:
        record = lease.read()
        assert (record.ttl_s, record.heartbeat_s, record.pid) == (120, 7, os.getpid())
        if os.path.exists(f"/proc/{os.getpid()}/stat"):
            assert record.pid_started is not None
    finally:
        lease.release()


@pytest.fixture
def live_process():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_live_local_holder_is_never_taken_over_however_old_its_heartbeat(tmp_path, live_process, caplog):
    url = str(tmp_path / "lock")
    _write_record(url, pid=live_process.pid, heartbeat_at=time.time() - 3600, ttl_s=1.0)
    lease = Lease(url, ttl_s=1)
    with caplog.at_level(logging.INFO, logger="rigging.lease"):
        assert not lease.try_acquire()
        assert not lease.try_acquire()
    assert lease.read().holder == "someone"
    assert "is alive" in caplog.text and str(live_process.pid) in caplog.text


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process start times are read from /proc")
def test_a_reused_pid_is_recognised_as_another_process(tmp_path, live_process):
    url = str(tmp_path / "lock")
    # The recorded holder had this pid once, but started at another time: it is gone.
    _write_record(url, pid=live_process.pid, pid_started="1", ttl_s=600.0)
    lease = Lease(url, ttl_s=600)
    assert lease.try_acquire()
    lease.release()


def test_a_heartbeat_in_the_future_is_suspect_until_the_record_stops_changing(tmp_path, caplog):
    url = str(tmp_path / "lock")
    _write_record(url, host="another-host", pid=1, heartbeat_at=time.time() + 3600, ttl_s=0.5)
    lease = Lease(url, ttl_s=600)
    with caplog.at_level(logging.WARNING, logger="rigging.lease"):
        assert not lease.try_acquire()  # age unknown: start watching the record
    assert "in the future" in caplog.text and url in caplog.text
    time.sleep(0.7)  # unchanged for longer than the holder's TTL, as this reader saw it
    assert lease.try_acquire()
    lease.release()


def test_a_future_heartbeat_that_keeps_changing_is_not_taken_over(tmp_path):
    url = str(tmp_path / "lock")
    lease = Lease(url, ttl_s=600)
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        # A live holder with a fast clock: its heartbeat moves, so it is alive whatever the clocks say.
        _write_record(url, host="another-host", pid=1, heartbeat_at=time.time() + 3600, ttl_s=0.5)
        assert not lease.try_acquire()
        time.sleep(0.1)
    assert lease.read().holder == "someone"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process start times are read from /proc")
def test_an_earlier_process_that_had_this_pid_is_recognised(tmp_path):
    url = str(tmp_path / "lock")
    _write_record(url, pid=os.getpid(), pid_started="1", ttl_s=600.0)  # e.g. a restarted container's runner
    lease = Lease(url, ttl_s=600)
    assert lease.try_acquire()
    lease.release()


def test_a_holder_in_another_pid_namespace_is_judged_by_its_heartbeat(tmp_path):
    url = str(tmp_path / "lock")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    # Same host name, but another container (or boot): that pid means nothing here, the heartbeat does.
    _write_record(url, pid=gone.pid, pid_namespace="another-boot/pid:[1]", ttl_s=600.0)
    assert not Lease(url, ttl_s=600).try_acquire()


def test_confirm_reads_the_lock_file_without_writing_it_while_the_heartbeat_is_recent(tmp_path):
    url = str(tmp_path / "lock")
    lease = Lease(url, ttl_s=60, heartbeat_s=30)
    assert lease.try_acquire()
    before = (os.stat(url).st_ino, open(url).read())
    assert lease.confirm() and not lease.lost
    assert (os.stat(url).st_ino, open(url).read()) == before  # read, not rewritten
    lease.release()


def test_confirm_beats_when_the_last_heartbeat_is_old(tmp_path, monkeypatch):
    url = str(tmp_path / "lock")
    lease = Lease(url, ttl_s=60, heartbeat_s=30)
    assert lease.try_acquire()
    written = lease.read().heartbeat_at
    monkeypatch.setattr(lease, "_written_at", time.time() - 16)  # more than half a heartbeat interval ago
    assert lease.confirm()
    assert lease.read().heartbeat_at > written
    lease.release()


def test_confirm_sees_a_takeover_that_the_heartbeat_thread_has_not_seen_yet(tmp_path):
    url = str(tmp_path / "lock")
    lease = Lease(url, ttl_s=60, heartbeat_s=30)
    assert lease.try_acquire()
    _write_record(url, holder="another-runner", host="another-host", pid=1)  # taken over meanwhile
    assert not lease.confirm()
    assert lease.lost
    lease.release()
    assert json.load(open(url))["holder"] == "another-runner"  # the new holder's lock is left alone


def test_release_does_not_wait_for_the_heartbeat_thread_and_no_beat_follows_it(tmp_path, caplog):
    url = str(tmp_path / "lock")
    lease = Lease(url, ttl_s=2, heartbeat_s=0.01)
    assert lease.try_acquire()
    time.sleep(0.1)  # several beats
    with caplog.at_level(logging.WARNING, logger="rigging.lease"):
        lease.release()
        time.sleep(0.1)  # a beat begun before the release would have finished by now
    assert not os.path.exists(url)
    assert not lease.lost
    assert not [r for r in caplog.records if "Lost lease" in r.getMessage()]
    assert lease.try_acquire()  # the object can hold the lease again, with a heartbeat of its own
    time.sleep(0.05)
    assert lease.read().holder == lease.holder_id and not lease.lost
    lease.release()
    assert not os.path.exists(url)
