"""Leases: a lock file that names its holder and is kept alive by a heartbeat.

A lease guards work that must happen once (one step, one shard) even when several processes on
several machines race for it. The lock file is JSON::

    {"holder": "<uuid>", "host": "...", "pid": 123, "acquired_at": 1.7e9, "heartbeat_at": 1.7e9}

The holder rewrites ``heartbeat_at`` every ``heartbeat_s`` seconds from a background thread. A
lease is *stale*, and may be taken over, when its heartbeat is older than ``ttl_s`` or when its
holder was a process on this host that no longer exists (so a crashed local run is retaken at
once instead of after the time-out). A holder that finds the file gone or naming someone else
sets :attr:`Lease.lost` and the :attr:`Lease.lost_event`; the work it guards should stop.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from rigging import filesystem as fsx
from rigging.log import get_logger

logger = get_logger(__name__)

DEFAULT_TTL_S = 60.0
DEFAULT_HEARTBEAT_S = 10.0


class LeaseError(RuntimeError):
    """Using a lease in a way that cannot work (releasing one never held, ...)."""


class LeaseLostError(RuntimeError):
    """The lease was taken over or deleted while its holder was still working."""


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    host: str
    pid: int
    acquired_at: float
    heartbeat_at: float

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "LeaseRecord | None":
        try:
            data = json.loads(text)
            return cls(**{k: data[k] for k in ("holder", "host", "pid", "acquired_at", "heartbeat_at")})
        except (ValueError, KeyError, TypeError):
            return None  # a torn or foreign file counts as no valid holder


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


class Lease:
    """A lease on ``url`` (the lock file itself).

    Use :meth:`acquire` / :meth:`release`, or ``with Lease(url) as lease:`` which waits until it
    holds the lease. ``holder_id`` defaults to a fresh random id per instance.
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
        self._thread: threading.Thread | None = None
        self._host = socket.gethostname()
        self._acquired_at = 0.0

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
        if record is None:
            return True
        now = time.time() if now is None else now
        if now - record.heartbeat_at > self.ttl_s:
            return True
        return record.host == self._host and record.pid != os.getpid() and not _process_alive(record.pid)

    # -- acquiring --------------------------------------------------------------------------------

    def _record(self) -> LeaseRecord:
        now = time.time()
        return LeaseRecord(self.holder_id, self._host, os.getpid(), self._acquired_at or now, now)

    def try_acquire(self) -> bool:
        """Take the lease if it is free or stale; never waits. True when this instance holds it."""
        if self.held:
            return True
        self._acquired_at = time.time()
        if fsx.create_exclusive(self.url, self._record().to_json()):
            return self._confirm_and_start()
        current_text = fsx.read_text(self.url)
        current = None if current_text is None else LeaseRecord.from_json(current_text)
        if current_text is None:
            # Released between our create and read: try once more.
            return fsx.create_exclusive(self.url, self._record().to_json()) and self._confirm_and_start()
        if current is not None and current.holder == self.holder_id:
            return self._confirm_and_start()
        if not self.is_stale(current):
            return False
        if not self._remove_if_unchanged(current_text):
            return False
        logger.info(
            "Taking over stale lease %s (holder %s on %s, pid %s)",
            self.url,
            current.holder if current else "?",
            current.host if current else "?",
            current.pid if current else "?",
        )
        return fsx.create_exclusive(self.url, self._record().to_json()) and self._confirm_and_start()

    def _remove_if_unchanged(self, observed_text: str) -> bool:
        """Delete the lock only if it still holds exactly what we judged stale.

        On local disk the lock is first renamed to a private name (atomic), so of two processes
        taking over the same stale lease only one removes it; the other finds nothing to rename.
        """
        fs, path = fsx.filesystem(self.url)
        if fsx.is_local(self.url):
            private = f"{path}.takeover-{self.holder_id}"
            try:
                os.rename(path, private)
            except FileNotFoundError:
                return False
            with open(private, encoding="utf-8") as handle:
                moved_text = handle.read()
            if moved_text != observed_text:
                # We moved a lease someone else just took over: put it back unless it was replaced.
                try:
                    os.link(private, path)
                except FileExistsError:
                    pass
                os.remove(private)
                return False
            os.remove(private)
            return True
        if fsx.read_text(self.url) != observed_text:
            return False
        fs.rm(path)
        return True

    def _confirm_and_start(self) -> bool:
        record = self.read()
        if record is None or record.holder != self.holder_id:
            return False
        self._held = True
        self.lost_event.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat_loop, name=f"lease-heartbeat:{self.url}", daemon=True)
        self._thread.start()
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
        record = self.read()
        if record is None or record.holder != self.holder_id:
            self._mark_lost(record)
            return False
        fsx.atomic_write(self.url, self._record().to_json())
        return True

    def _mark_lost(self, record: LeaseRecord | None) -> None:
        if not self.lost_event.is_set():
            who = f"holder {record.holder} on {record.host}" if record else "nobody (the lock file is gone)"
            logger.warning("Lost lease %s: it now names %s", self.url, who)
            self.lost_event.set()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self.heartbeat():
                    return
            except Exception as exc:  # a flaky filesystem must not kill the thread silently
                logger.warning("Heartbeat for lease %s failed: %s", self.url, exc)

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease was lost; cheap enough to call in a loop."""
        if self.lost_event.is_set():
            raise LeaseLostError(f"Lease {self.url} was lost; another process may have taken over this work.")

    def release(self) -> None:
        """Stop the heartbeat and delete the lock file if it still names this holder."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        if not self._held:
            return
        self._held = False
        record = self.read()
        if record is not None and record.holder == self.holder_id:
            fsx.rm(self.url)

    def __enter__(self) -> "Lease":
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
