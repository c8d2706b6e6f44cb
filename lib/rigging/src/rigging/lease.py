"""Leases: a lock file that names its holder and is kept alive by a heartbeat.

A lease guards work that must happen once (one step, one shard) even when several processes on
several machines race for it. The lock file is JSON::

    {"holder": "<uuid>", "host": "...", "pid": 123, "pid_started": "8812345", "pid_namespace": "...",
     "acquired_at": 1.7e9, "heartbeat_at": 1.7e9, "ttl_s": 60.0, "heartbeat_s": 10.0}

The holder rewrites ``heartbeat_at`` every ``heartbeat_s`` seconds in the background (one thread
keeps the time of every lease of the process: :mod:`rigging.heartbeats`). A
holder that finds the file gone or naming someone else sets :attr:`Lease.lost` and the
:attr:`Lease.lost_event`; the work it guards should stop.

When may another process take a lease over (is it *stale*)? The holder is judged by its own
terms, never the reader's, and a live process is never robbed:

1. **A process of this machine** (same host name and, on Linux, same boot and pid namespace, so a
   pid means the same process to both): stale at once if that pid is gone, a zombie, or was reused
   by a process that started at another time than the one recorded (``pid_started``, the start
   time from ``/proc/<pid>/stat``; where that cannot be read, a reused pid looks alive and the
   lease waits for the newcomer to exit). While the process lives the lease is *never* stale,
   however old its heartbeat: a stuck local process is stuck, not gone; stop it to free the lease.
2. **Anyone else**: stale when ``heartbeat_at`` is older than the holder's recorded ``ttl_s``
   (records without one, from older versions, are judged by the reader's ``ttl_s``). This trusts
   the two clocks to agree to well within a TTL.
3. **A heartbeat in the future** by more than :data:`CLOCK_SKEW_TOLERANCE_S` (a wrong clock, or a
   garbage value) says nothing about the holder's age. The reader warns, then measures with its own
   monotonic clock how long the record has stayed byte-for-byte the same: a live holder rewrites
   it every heartbeat, so a record unchanged for longer than the holder's TTL belongs to nobody.
   A fast-clocked live holder is therefore never taken over, and a dead one is, one TTL after the
   reader first saw its last record.

Every change to the lock file is conditional (:mod:`rigging.filesystem`'s conditional writes): it
is created only if absent; taking a stale lease over deletes exactly the record judged stale, then
creates the lock anew, so of two takers one wins; a heartbeat rewrites the record only if it still
is the version its holder last wrote, so a holder that was taken over never overwrites the new
holder's lock: its heartbeat fails, and it learns it lost the lease. Local disk, S3, GCS and
``memory://`` (within one process) offer these writes; a lease anywhere else is refused
(:class:`LeaseUnsupportedError`) rather than held by a check-then-write that two runners could
both pass. On local disk a heartbeat compares, then renames its new record into place: a takeover
landing between the two (possible only for a holder already judged stale) is overwritten, and the
taker learns at its next heartbeat that it lost.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

from rigging import conditional_writes
from rigging import filesystem as fsx
from rigging.errors import RiggingError
from rigging.heartbeats import HEARTBEATS
from rigging.log import get_logger

logger = get_logger(__name__)

DEFAULT_TTL_S = 60.0
DEFAULT_HEARTBEAT_S = 10.0
# How far in the future a heartbeat may be before its age counts as unknown: well above the skew of
# NTP-synchronised machines, well below any useful TTL.
CLOCK_SKEW_TOLERANCE_S = 5.0


class LeaseError(RiggingError, RuntimeError):
    """Using a lease in a way that cannot work (releasing one never held, ...)."""


class LeaseUnsupportedError(LeaseError):
    """The lock file's storage cannot hold a lease safely (no conditional writes)."""


class LeaseLostError(RiggingError, RuntimeError):
    """The lease was taken over or deleted while its holder was still working."""


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    host: str
    pid: int
    acquired_at: float
    heartbeat_at: float
    # Absent (None) in records written by older versions.
    ttl_s: float | None = None
    heartbeat_s: float | None = None
    pid_started: str | None = None
    pid_namespace: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "LeaseRecord | None":
        try:
            data = json.loads(text)
            return cls(
                holder=str(data["holder"]),
                host=str(data["host"]),
                pid=int(data["pid"]),
                acquired_at=float(data["acquired_at"]),
                heartbeat_at=float(data["heartbeat_at"]),
                ttl_s=_positive_or_none(data.get("ttl_s")),
                heartbeat_s=_positive_or_none(data.get("heartbeat_s")),
                pid_started=None if data.get("pid_started") is None else str(data["pid_started"]),
                pid_namespace=None if data.get("pid_namespace") is None else str(data["pid_namespace"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # a torn or foreign file counts as no valid holder


def _parse(current: conditional_writes.Versioned | None) -> LeaseRecord | None:
    return None if current is None else LeaseRecord.from_json(current.data.decode("utf-8", "replace"))


def _positive_or_none(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


# -- who a pid is -------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) from ``/proc/<pid>/stat``; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    # Field 2, the command name, may hold spaces and parentheses; the fields after its last ")" do not.
    fields = text.rsplit(")", 1)[-1].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _process_start_time(pid: int) -> str | None:
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


@functools.lru_cache(maxsize=4)
def _this_process(pid: int) -> tuple[str | None, str | None]:
    """(start time, pid namespace) of this process, read once per pid (a forked child has its own):
    a run makes a lease per step."""
    return _process_start_time(pid), _pid_namespace()


def _pid_namespace() -> str | None:
    """The boot and pid namespace this process's pids belong to (Linux), or None where unknown.

    Containers can share a host name but not pids; after a reboot old pids mean nothing.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as handle:
            boot = handle.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def process_alive(pid: int, started: str | None = None) -> bool:
    """Whether ``pid`` is a running process (not a zombie) that started at ``started`` (if known): one
    of this machine's, seen from its pid namespace."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc: existence is all we can tell
    state, start_time = stat
    if state in ("Z", "X"):
        return False  # exited, waiting for its parent to collect it
    return started is None or start_time == started


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a process is, in terms another process can check: host, pid, start time, pid namespace."""

    host: str
    pid: int
    started: str | None
    namespace: str | None

    @classmethod
    def of_this_process(cls) -> "ProcessIdentity":
        return cls(socket.gethostname(), os.getpid(), _process_start_time(os.getpid()), _pid_namespace())

    def alive_here(self) -> bool | None:
        """Whether the process runs, when it is one of this machine's (same host, boot and pid
        namespace); ``None`` when this machine cannot tell (another host or container)."""
        if self.host != socket.gethostname():
            return None
        if self.namespace is not None and self.namespace != _pid_namespace():
            return None
        return process_alive(self.pid, self.started)

    def send_signal(self, signum: int) -> bool:
        """Send ``signum`` to the process, and to the process group it leads if it leads one (a job's
        process runs in a session of its own: what it started hears it too), only while
        :meth:`alive_here` says it is this very process (same machine, pid and start time). Whether
        it was sent."""
        if self.alive_here() is not True:
            return False
        try:
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True


class Lease:
    """A lease on ``url`` (the lock file itself).

    Use :meth:`acquire` / :meth:`release`, or ``with Lease(url) as lease:`` which waits until it
    holds the lease. ``holder_id`` defaults to a fresh random id per instance. ``ttl_s`` and
    ``heartbeat_s`` are written into the lock file: others judge this holder by them.
    """

    def __init__(
        self,
        url: str,
        *,
        holder_id: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise LeaseError(f"ttl_s must be positive, got {ttl_s}.")
        self.url = url
        self.holder_id = holder_id or uuid.uuid4().hex
        self.ttl_s = ttl_s
        # Several heartbeats fit in one time-to-live so one slow write does not cost the lease.
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else min(DEFAULT_HEARTBEAT_S, ttl_s / 4)
        self.lost_event = threading.Event()
        self._held = False
        self._stop = threading.Event()
        self._host = socket.gethostname()
        self._pid_started, self._pid_namespace = _this_process(os.getpid())
        self._acquired_at = 0.0
        self._version: str | None = None  # of the record this holder last wrote
        self._writing = threading.RLock()  # one heartbeat at a time: each starts from the last one's version
        self._written_at = 0.0  # time.time() of this holder's last record written (or confirmed written)
        # The record whose age is unknown (future heartbeat) and when this reader first saw it.
        self._watched: tuple[LeaseRecord, float] | None = None
        self._reported: set[tuple[str, str]] = set()  # (what, holder): say each thing once, not every poll

    # -- state ----------------------------------------------------------------------------------

    @property
    def held(self) -> bool:
        return self._held and not self.lost_event.is_set()

    @property
    def lost(self) -> bool:
        return self.lost_event.is_set()

    def read(self) -> LeaseRecord | None:
        """The current lock file's record, or ``None`` if there is none (or it is unreadable)."""
        text = fsx.read_text(self.url)
        return None if text is None else LeaseRecord.from_json(text)

    def is_stale(self, record: LeaseRecord | None, now: float | None = None) -> bool:
        """Whether ``record``'s holder may be taken over (the rules are in the module docstring).

        A record with a future heartbeat becomes stale only through repeated calls that see it
        unchanged, so call this each time the lock file is read, as :meth:`acquire` does.
        """
        if record is None:
            return True
        alive = self._local_holder_alive(record)
        if alive is not None:
            if alive:
                self._report_live_local_holder(record, now)
            return not alive
        ttl = record.ttl_s or self.ttl_s
        age = (time.time() if now is None else now) - record.heartbeat_at
        if math.isfinite(age) and age >= -CLOCK_SKEW_TOLERANCE_S:
            return age > ttl
        self._report_future_heartbeat(record, age, ttl)
        return self._unchanged_for(record) > ttl

    def _local_holder_alive(self, record: LeaseRecord) -> bool | None:
        """Whether the holder's process lives, if it is one this process can look at; else None."""
        if record.host != self._host:
            return None
        if record.pid_namespace is not None and record.pid_namespace != self._pid_namespace:
            return None  # same name, but another container or boot: its pids are not ours to check
        if record.pid == os.getpid() and record.pid_started in (None, self._pid_started):
            return None  # another lease object of this process: its heartbeats speak for it
        return process_alive(record.pid, record.pid_started)

    def _unchanged_for(self, record: LeaseRecord) -> float:
        now = time.monotonic()
        if self._watched is None or self._watched[0] != record:
            self._watched = (record, now)
        return now - self._watched[1]

    def _report_once(self, what: str, record: LeaseRecord) -> bool:
        key = (what, record.holder)
        if key in self._reported:
            return False
        self._reported.add(key)
        return True

    def _report_live_local_holder(self, record: LeaseRecord, now: float | None) -> None:
        if self._report_once("alive", record):
            age = (time.time() if now is None else now) - record.heartbeat_at
            logger.info(
                "Lease %s is held by pid %d on this host, which is alive (last heartbeat %.0f s ago); "
                "waiting for it to finish. If that process is stuck, stop it (kill %d) to free the lease.",
                self.url, record.pid, age, record.pid,
            )

    def _report_future_heartbeat(self, record: LeaseRecord, age: float, ttl: float) -> None:
        if self._report_once("future", record):
            logger.warning(
                "Lease %s: the heartbeat of holder %s (%s, pid %d) is %.0f s in the future, so its age is "
                "unknown (a clock is wrong, or the file holds garbage). It counts as stale only once it stays "
                "unchanged for %.0f s (the holder's TTL) from now. Check the clocks (NTP) of both machines; "
                "if no runner is alive, delete the lock file %s.",
                self.url, record.holder, record.host, record.pid, -age, ttl, self.url,
            )

    # -- acquiring --------------------------------------------------------------------------------

    def _record(self) -> LeaseRecord:
        now = time.time()
        return LeaseRecord(
            holder=self.holder_id,
            host=self._host,
            pid=os.getpid(),
            acquired_at=self._acquired_at or now,
            heartbeat_at=now,
            ttl_s=self.ttl_s,
            heartbeat_s=self.heartbeat_s,
            pid_started=self._pid_started,
            pid_namespace=self._pid_namespace,
        )

    def try_acquire(self) -> bool:
        """Take the lease if it is free or stale; never waits. True when this instance holds it."""
        if self.held:
            return True
        self._check_storage()
        self._acquired_at = time.time()
        if conditional_writes.create_exclusive(self.url, self._record().to_json()):
            return self._confirm_and_start()
        current = conditional_writes.read_versioned(self.url)
        if current is None:
            # Released between our create and read: try once more.
            return conditional_writes.create_exclusive(self.url, self._record().to_json()) and self._confirm_and_start()
        record = _parse(current)
        if record is not None and record.holder == self.holder_id:
            return self._confirm_and_start()
        if not self.is_stale(record):
            return False
        # Delete exactly the record judged stale: if it changed since (its holder woke up, or another
        # taker was faster), this fails and the lease stays with whoever holds it now.
        if not conditional_writes.remove_if_unchanged(self.url, current.version):
            return False
        logger.info(
            "Taking over stale lease %s (holder %s on %s, pid %s)",
            self.url,
            record.holder if record else "?",
            record.host if record else "?",
            record.pid if record else "?",
        )
        return conditional_writes.create_exclusive(self.url, self._record().to_json()) and self._confirm_and_start()

    def _check_storage(self) -> None:
        try:
            conditional_writes.check_conditional_writes(self.url)
        except conditional_writes.ConditionalWritesUnsupportedError as exc:
            raise LeaseUnsupportedError(
                f"Cannot hold a lease on {self.url}: it is on {exc.protocol}://, where {exc.missing}, so two runners "
                "could both take it and run the same work twice. Put the prefix on local disk (or a shared disk "
                "with hard links), on s3:// or gs://, or on memory:// within one process."
            ) from exc

    def _confirm_and_start(self) -> bool:
        current = conditional_writes.read_versioned(self.url)
        record = _parse(current)
        if current is None or record is None or record.holder != self.holder_id:
            return False
        self._version = current.version
        self._written_at = time.time()
        self._held = True
        self.lost_event.clear()
        # Each holding has its own stop signal: a beat still finishing after a release (release does
        # not wait for it) never schedules another for a later holding of this object.
        self._stop = threading.Event()
        HEARTBEATS.every(self.heartbeat_s, self.heartbeat, self._stop, name=f"lease-heartbeat:{self.url}")
        return True

    def acquire(self, *, timeout_s: float | None = None, poll_s: float = 0.5) -> bool:
        """Wait until the lease is held (or ``timeout_s`` passes; then False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.try_acquire():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    # -- holding ----------------------------------------------------------------------------------

    def heartbeat(self) -> bool:
        """Refresh the heartbeat now; False (and :attr:`lost` set) if the lease is no longer ours."""
        with self._writing:
            if self._stop.is_set() and not self._held:
                return False  # released meanwhile: the lock file is no longer this holder's to write
            record_json = self._record().to_json()
            version = conditional_writes.replace_if_unchanged(self.url, record_json, self._version or "")
            if version is not None:
                self._version = version
                self._written_at = time.time()
                return True
            current = conditional_writes.read_versioned(self.url)
            record = _parse(current)
            if current is None or record is None or record.holder != self.holder_id:
                self._mark_lost(record)
                return False
            # Our own record, at a version we never saw: an earlier write of ours whose reply was lost.
            # It is at most one heartbeat old, so it stands for this one; the next starts from it.
            self._version = current.version
            return True

    def confirm(self) -> bool:
        """Whether the lock file itself still holds this holder's last record; False (and :attr:`lost`
        set) if not. A read, not a write, unless the last heartbeat is more than half a heartbeat
        interval old: then it is one (so the lease has most of its time to live after this).

        For the moment before an irrevocable act (a commit): the last heartbeat may be
        up to a heartbeat interval old.
        """
        with self._writing:
            if time.time() - self._written_at > self.heartbeat_s / 2:
                return self.heartbeat()
            current = conditional_writes.read_versioned(self.url)
            if current is not None and current.version == self._version:
                return True
            record = _parse(current)
            if current is None or record is None or record.holder != self.holder_id:
                self._mark_lost(record)
                return False
            self._version = current.version  # ours, at a version we never saw: see heartbeat()
            return True

    def _mark_lost(self, record: LeaseRecord | None) -> None:
        if not self.lost_event.is_set():
            who = f"holder {record.holder} on {record.host}" if record else "nobody (the lock file is gone)"
            logger.warning("Lost lease %s: it now names %s", self.url, who)
            self.lost_event.set()

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease was lost; cheap enough to call in a loop."""
        if self.lost_event.is_set():
            raise LeaseLostError(f"Lease {self.url} was lost; another process may have taken over this work.")

    def release(self) -> None:
        """Stop the heartbeat and delete the lock file if it still names this holder.

        The heartbeats are told to stop, not waited for: a beat already begun is finished first
        (both hold the write lock), and none begins after this one has.
        """
        self._stop.set()
        with self._writing:
            if not self._held:
                return
            self._held = False
            # On local disk the delete's condition is checked under the file's lock, so this holder's own
            # last write is deleted at once, without reading it first. Elsewhere the record is read
            # first: a store that ignored a delete's condition would otherwise delete a new holder's lock.
            if fsx.is_local(self.url) and not self.lost and conditional_writes.remove_if_unchanged(self.url, self._version or ""):
                return
            current = conditional_writes.read_versioned(self.url)
            record = _parse(current)
            if current is not None and record is not None and record.holder == self.holder_id:
                conditional_writes.remove_if_unchanged(self.url, current.version)

    def __enter__(self) -> "Lease":
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
