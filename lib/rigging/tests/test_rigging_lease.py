import json
import os
import socket
import subprocess
import sys
import time

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
