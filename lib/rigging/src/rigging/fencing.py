"""Fencing tokens: a JSON record that names its owner by a generation that only grows.

A lease (:mod:`rigging.lease`) decides who may *start* a piece of work. It cannot stop a holder
that was judged gone but still runs (a paused process, a machine cut off from the lock, a child
process its parent left behind) from writing on. A fencing token can, if every write that
matters is checked against it:

* the record (one small JSON file) carries ``generation``, a number, and ``owner``, an opaque id;
* :func:`claim` takes the work over by writing ``generation + 1`` conditionally on the record
  being exactly the version the claimer read, so of two claimers one wins, and a generation is
  never handed out twice;
* :meth:`Fence.update` rewrites the record only while it still names the fence's generation and
  owner (read, compare, then a conditional replace of that version; retried if a write of the same
  owner came between), and :meth:`Fence.check` asks the same question without writing.

An owner whose update or check fails with :class:`FencedOff` has been superseded: whatever it
writes from then on must not become the work's result, and it should stop. The writes that make
a result (a commit) are themselves updates of the record, so a superseded owner cannot make one.
Where the storage can hold the record across other work (local disk, :meth:`Fence.held`), an
owner may also write other files while no one can take the record over, then update it.

The conditional writes are :mod:`rigging.conditional_writes`': local disk (compare and replace
under a lock of the file, exact between the processes of a machine), ``s3://``, ``gs://`` and
``memory://``.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rigging import conditional_writes
from rigging.errors import RiggingError

GENERATION = "generation"
OWNER = "owner"

# A fence's own writes can race each other (two processes of one owner): a few retries settle it.
_UPDATE_RETRIES = 20


class FencedOff(RiggingError, RuntimeError):
    """The record no longer names this fence's generation: another owner took the work over."""


@dataclass(frozen=True)
class Snapshot:
    """A record as read: its fields (``None`` when absent or unreadable) and the version to write over."""

    data: dict[str, Any] | None
    version: str | None  # None: no file

    @property
    def generation(self) -> int:
        value = (self.data or {}).get(GENERATION)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def read_snapshot(url: str) -> Snapshot:
    """The record at ``url`` with its version, read in one request."""
    current = conditional_writes.read_versioned(url)
    return Snapshot(None, None) if current is None else _snapshot(current.data, current.version)


def _snapshot(raw: bytes, version: str) -> Snapshot:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        data = None
    return Snapshot(data if isinstance(data, dict) else None, version)


def _encode(data: dict[str, Any]) -> str:
    # One line, by the C encoder: a record is rewritten several times per step, and an indented
    # dump goes through the pure-Python encoder at several times the cost.
    return json.dumps(data, sort_keys=True)


def write_over(url: str, snapshot: Snapshot, data: dict[str, Any]) -> bool:
    """Write ``data`` only if the record is still exactly ``snapshot``; True when it was written."""
    payload = _encode(data)
    if snapshot.version is None:
        return conditional_writes.create_exclusive(url, payload)
    return conditional_writes.replace_if_unchanged(url, payload, snapshot.version) is not None


def claim(url: str, data: dict[str, Any], over: Snapshot, *, owner: str | None = None) -> Fence | None:
    """Become the owner: write ``data`` with the generation after ``over``'s, if the record is still ``over``.

    ``over`` is the snapshot the caller decided on (:func:`read_snapshot`); if the record changed
    since, nothing is written and the result is ``None``: read again and decide again.
    """
    fence = Fence(url, over.generation + 1, owner or uuid.uuid4().hex[:16])
    if not write_over(url, over, {**data, GENERATION: fence.generation, OWNER: fence.owner}):
        return None
    return fence


@dataclass(frozen=True)
class Fence:
    """The right to write the record at ``url`` as generation ``generation`` (see the module docstring)."""

    url: str
    generation: int
    owner: str

    def owns(self, snapshot: Snapshot) -> bool:
        data = snapshot.data or {}
        return data.get(GENERATION) == self.generation and data.get(OWNER) == self.owner

    def check(self) -> Snapshot:
        """The record as it is now; raises :class:`FencedOff` unless it still names this fence."""
        snapshot = read_snapshot(self.url)
        if not self.owns(snapshot):
            raise self._fenced_off(snapshot)
        return snapshot

    def update(self, changes: dict[str, Any], *, condition: Any = None) -> dict[str, Any]:
        """Merge ``changes`` into the record while it names this fence; the record written.

        ``condition(fields) -> str | None`` may refuse the write for a reason of the caller's
        (returned as the message of :class:`FencedOff`); it sees the record as it is at the write.
        """
        for _ in range(_UPDATE_RETRIES):
            snapshot = self.check()
            if condition is not None:
                refusal = condition(snapshot.data or {})
                if refusal:
                    raise FencedOff(refusal)
            data = {**(snapshot.data or {}), **changes, GENERATION: self.generation, OWNER: self.owner}
            if write_over(self.url, snapshot, data):
                return data
        raise FencedOff(f"{self.url}: could not update the record after {_UPDATE_RETRIES} tries; it keeps changing")

    @contextlib.contextmanager
    def held(self, *, condition: Any = None) -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
        """Hold the record while it names this fence: no claim or update of it lands before the block ends.

        For work that must take effect only while this owner still holds the work: files written
        in the block are written under the fence, and the block ends with its one update of the
        record, ``write(changes)`` (merged as :meth:`update` merges; it returns the record written).
        ``condition`` and :class:`FencedOff` as for :meth:`update`, raised before the block runs, as
        is :class:`~rigging.conditional_writes.CannotHoldError` on storage that cannot hold a record
        (see :func:`~rigging.conditional_writes.held`).
        """
        with conditional_writes.held(self.url) as record:
            snapshot = Snapshot(None, None) if record is None else _snapshot(record.data, record.version)
            if not self.owns(snapshot):
                raise self._fenced_off(snapshot)
            refusal = condition(snapshot.data or {}) if condition is not None else None
            if refusal:
                raise FencedOff(refusal)

            def write(changes: dict[str, Any]) -> dict[str, Any]:
                data = {**(snapshot.data or {}), **changes, GENERATION: self.generation, OWNER: self.owner}
                record.replace(_encode(data))
                return data

            yield write

    def _fenced_off(self, snapshot: Snapshot) -> FencedOff:
        if snapshot.data is None:
            now = "it is gone" if snapshot.version is None else "it cannot be read"
        else:
            now = f"it names generation {snapshot.generation} (owner {snapshot.data.get(OWNER)})"
        return FencedOff(f"{self.url} no longer names generation {self.generation} (owner {self.owner}): {now}")
