"""``marin logs``: every attempt of a step and what its replicas printed, read from the step's folder.

Attempts are kept by :mod:`iris.attempt_log` (``<step>/.attempts/NNN/``), whichever engine ran
them. Each is printed oldest first under its one-line description, then its replicas' logs (a
header per replica when there are several). Logs are streamed in bounded chunks, so a log of any
size is never held in memory.

``--follow`` then keeps reading the newest attempt from the offsets already printed, picks up
attempts that start meanwhile, and stops once that attempt's record has an outcome and the step's
status is no longer RUNNING: the record is written after the logs' last flush, so logs read after
seeing it are complete. A step whose status left RUNNING while its attempt never got an outcome (a
writer that died), or that says RUNNING while nothing runs it (no live lease, no replica
heartbeating: its runner was killed), is followed for :data:`ORPHAN_GRACE_S` more seconds, then
left with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from iris.attempt_log import AttemptListing, as_dict, list_attempts, read_log
from rigging import filesystem as fsx
from rigging.config.discovery import discover_config
from rigging.lease import Lease
from rigging.regular_files import RefusedFileError

from marin.execution.records.catalog import closest_step_names, find_step_folders
from marin.execution.records.executor_files import LOCK_FILE, STATUS_RUNNING, read_status
from marin.execution.ownership.step_ownership import has_live_writer

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # what a shell reports for Ctrl-C
CHUNK_BYTES = 1 << 20
POLL_S = 1.0
RECORD_WAIT_S = 5.0  # how long a new attempt folder may lack its attempt.json before it is shown as unreadable
ORPHAN_GRACE_S = 15.0  # longer than a remote writer's flush interval (iris.attempt_log.REMOTE_FLUSH_S)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "logs",
        help="print every attempt of a step and what its replicas printed",
        description="Print the step's attempts, oldest first, each with its replicas' output "
        "(kept in <step>/.attempts/ by every engine that ran it).",
    )
    parser.add_argument("step", help="a step name, its folder (name-hash, relative to the prefix) or a path")
    parser.add_argument("--prefix", help="folder or fsspec URL (default: the discovered prefix)")
    parser.add_argument("--attempt", type=int, metavar="N", help="only attempt N (1 is the first)")
    parser.add_argument("--follow", "-f", action="store_true",
                        help="keep printing the newest attempt's output as it grows, until the step stops running")
    parser.add_argument("--json", action="store_true", help="print the attempts' records and log locations as JSON")
    parser.set_defaults(handler=logs_command)


def logs_command(args: argparse.Namespace) -> int:
    try:
        return _logs(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `marin logs STEP | head`
        return EXIT_OK


def _logs(args: argparse.Namespace) -> int:
    if args.follow and args.json:
        print("marin logs: --follow and --json do not go together (JSON lists the attempts once)", file=sys.stderr)
        return EXIT_USAGE
    prefix = discover_config(prefix=args.prefix).prefix
    folders = find_step_folders(prefix, args.step)
    if not folders:
        close = closest_step_names(prefix, args.step)
        hint = f"; closest: {', '.join(close)}" if close else " (marin status lists them)"
        print(f"marin logs: no step output found for {args.step!r} under {prefix}{hint}", file=sys.stderr)
        return EXIT_USAGE
    folder = folders[0]
    if len(folders) > 1:
        print(f"marin logs: {len(folders)} outputs exist for {args.step!r}; showing the newest, {folder}", file=sys.stderr)
    listings = list_attempts(folder)
    if args.attempt is not None:
        chosen = [listing for listing in listings if listing.attempt == args.attempt]
        if not chosen:
            have = ", ".join(str(listing.attempt) for listing in listings) or "none"
            print(f"marin logs: {folder} has no attempt {args.attempt} (attempts: {have})", file=sys.stderr)
            return EXIT_USAGE
        listings = chosen
    if args.json:
        print(json.dumps({"step": folder, "status": _status(folder), "attempts": [_json_listing(item) for item in listings]},
                         indent=1))
        return EXIT_OK
    follow = args.follow and (bool(listings) or _status(folder) in (STATUS_RUNNING, _ABANDONED))
    if not listings:
        print(f"{folder}: no attempts recorded" + ("; waiting for one to start" if follow else ""), flush=True)
        if not follow:
            return EXIT_OK
    printer = _Printer()
    for listing in listings:
        printer.attempt(listing)
    if follow:
        _follow(folder, printer, only=args.attempt)
    return EXIT_OK


# What _status calls a RUNNING record that nothing runs any more.
_ABANDONED = "RUNNING, abandoned"


def _status(folder: str, lease: Lease | None = None) -> str | None:
    """The step's status word; with ``lease`` (a reader's lease on the step), RUNNING that nothing
    runs reads as :data:`_ABANDONED`."""
    status = read_status(folder)
    if status is None:
        return None
    if lease is not None and status.status == STATUS_RUNNING and not has_live_writer(folder, status, lease):
        return _ABANDONED
    return status.status


def _json_listing(listing: AttemptListing) -> dict[str, Any]:
    sizes = {}
    for url in listing.logs:
        fs, path = fsx.filesystem(url)
        try:
            sizes[url] = fs.size(path)
        except FileNotFoundError:
            sizes[url] = 0
    return {**as_dict(listing), "log_bytes": sizes}


class _Printer:
    """Prints attempts and the new bytes of their logs, remembering how far each log was printed."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.refused: set[str] = set()  # logs that are no regular file (a FIFO would block): said once, then passed over
        self.current: AttemptListing | None = None
        self._last_log: str | None = None
        self._at_line_start = True

    def attempt(self, listing: AttemptListing) -> None:
        self.current = listing
        self._last_log = None
        self._text(f"=== {listing.describe()}\n")
        self.drain(listing)

    def drain(self, listing: AttemptListing) -> int:
        """Print what each of the attempt's logs gained since last time; the number of bytes printed."""
        printed = 0
        for url in listing.logs:
            if url in self.refused:
                continue
            offset = self.offsets.get(url, 0)
            while True:
                try:
                    chunk = read_log(url, offset, CHUNK_BYTES)
                except RefusedFileError as exc:
                    self.refused.add(url)
                    self._text(f"--- replica {_replica_number(url)}: {exc}\n")
                    self._last_log = None
                    break
                if not chunk:
                    break
                if url != self._last_log and len(listing.logs) > 1:
                    self._text(f"--- replica {_replica_number(url)}\n")
                self._last_log = url
                self._bytes(chunk)
                offset += len(chunk)
                printed += len(chunk)
            self.offsets[url] = offset
        return printed

    def line(self, text: str) -> None:
        self._text(text + "\n")

    def _text(self, text: str) -> None:
        if not self._at_line_start:
            self._bytes(b"\n")
        self._bytes(text.encode("utf-8"))

    def _bytes(self, data: bytes) -> None:
        # Logs are passed through as bytes: a tool's output need not be valid UTF-8.
        out = getattr(sys.stdout, "buffer", None)
        if out is not None:
            sys.stdout.flush()
            out.write(data)
            out.flush()
        else:
            sys.stdout.write(data.decode("utf-8", errors="replace"))
            sys.stdout.flush()
        self._at_line_start = data.endswith(b"\n")


def _finished(listing: AttemptListing) -> bool:
    return listing.record is not None and listing.record.finished


def _replica_number(url: str) -> int:
    name = url.rstrip("/").rsplit("/", 1)[-1]  # replica-003.log
    digits = name.removeprefix("replica-").removesuffix(".log")
    return int(digits) if digits.isdigit() else -1


def _follow(folder: str, printer: _Printer, only: int | None) -> None:
    """Poll the newest attempt until it has an outcome and the step is not RUNNING (attempt ``only``: until it has an outcome)."""
    orphaned_since: float | None = None
    first_seen: dict[int, float] = {}
    lease = Lease(fsx.join(folder, LOCK_FILE))  # only read, to tell a live runner from a killed one
    while True:
        time.sleep(POLL_S)
        listings = list_attempts(folder)
        if only is not None:
            listings = [listing for listing in listings if listing.attempt == only]
        current = printer.current
        for listing in listings:
            if current is not None and listing.attempt == current.attempt:
                printer.current = listing  # its record and replica logs as they are now
                printer.drain(listing)
                if _finished(listing) and not _finished(current):
                    printer.line(f"=== {listing.describe()}")  # how the attempt followed so far ended
            elif current is None or listing.attempt > current.attempt:
                # A folder whose record is not there yet is being opened right now: its writer makes the
                # folder, then writes attempt.json. Wait for it a little rather than call it unreadable.
                seen = first_seen.setdefault(listing.attempt, time.monotonic())
                if listing.record is None and time.monotonic() - seen < RECORD_WAIT_S:
                    break
                printer.attempt(listing)
        newest = printer.current
        status = _status(folder, lease)
        if newest is None:
            if status == STATUS_RUNNING:
                continue
            if status == _ABANDONED:
                orphaned_since = orphaned_since or time.monotonic()
                if time.monotonic() - orphaned_since <= ORPHAN_GRACE_S:
                    continue
                print(_ABANDONED_NOTE, file=sys.stderr)
            return
        finished = _finished(newest)
        if finished and only is not None:
            return  # one attempt asked for, and it has ended; later ones are not its story
        if status == STATUS_RUNNING:
            orphaned_since = None
            continue
        if finished and status != _ABANDONED:
            return
        orphaned_since = orphaned_since or time.monotonic()
        if time.monotonic() - orphaned_since > ORPHAN_GRACE_S:
            if status == _ABANDONED:
                print(_ABANDONED_NOTE, file=sys.stderr)
            else:
                print(f"marin logs: the step is {status or 'not running'} but attempt {newest.attempt} never recorded an "
                      "outcome (its writer stopped); stopped following", file=sys.stderr)
            return


_ABANDONED_NOTE = ("marin logs: the step's status says RUNNING, but no runner holds it and no replica heartbeats (its "
                   "runner was killed?); stopped following. Run the experiment again to resume the step.")


__all__ = ["register", "logs_command"]
