"""Who owns a step's folder now: one execution at a time, fenced, writing into its own staging folder.

The step's lease (:mod:`rigging.lease`) decides which runner may *start* the step. It cannot stop
what that runner started from writing on once the runner is judged gone: a replica whose
supervisor was killed, a job that outlived its runner. So the right to write the step's output
belongs to an *execution*, fenced by a token (:mod:`rigging.fencing`):

* ``.executor_status`` is the fenced record. Starting an execution claims it: ``generation`` one
  higher than the record read, a new ``owner`` id, and ``staging``, the folder the execution
  writes into (``.staging-g<generation>``, always a new one; versions before this one used
  ``.staging/g<generation>``, which is still read, finished and removed). Every later status write
  of the execution is conditional on the record still naming it.
* The step's function writes only into the staging folder. Two executions never share one, so
  their bytes are never mixed.
* :meth:`Execution.commit` makes the output the step's: it refuses an output holding a special file
  or a link out of it (:func:`check_regular_output`, the readers' rule), then the artifact and the checksums of the output
  files (:mod:`zephyr.output_checksums`, which readers check) are written into the staging
  folder, the record is marked ``committing`` (the commit point, refused unless the record names
  this execution and says RUNNING), every entry of the staging folder is moved into the step
  folder, and SUCCESS is written last. A commit cut short is finished by whoever finds the
  record ``committing`` next (:func:`roll_forward`): moving is idempotent. An execution that
  staged no file at all, on local disk, has nothing to move: its artifact is written into the step
  folder and SUCCESS recorded while it holds the record (:meth:`~rigging.fencing.Fence.held`), so
  no other execution can claim the step between the two; cut short, it left no SUCCESS, and the
  next execution's commit replaces the artifact.
* Replicas of an execution run elsewhere (iris jobs) watch the record (:class:`ReplicaWatch`):
  each heartbeat writes ``.executions/g<generation>-replica-<i>.json`` and checks the fence; a
  replica whose execution was superseded, or ended by its runner, stops itself and commits nothing.

The one who fences an execution off also ends its processes (:mod:`marin.execution.ownership.ending_executions`).
A new execution never continues in a predecessor's staging folder: once each of the predecessor's
replicas is known dead it takes over only its resumable state (:mod:`marin.execution.ownership.resumable_state`:
checkpoints, finished token-cache shards, what the step declared), and the rest stays where nothing
reads it until a commit deletes it.

What this cannot fence: a step's side effects outside its folder (a database write, an upload
elsewhere), and, on local disk, a write that lands within one local read of a takeover.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iris.attempt_log import ATTEMPTS_FOLDER
from rigging import filesystem as fsx
from rigging.conditional_writes import CannotHoldError
from rigging.fencing import Fence, FencedOff, Snapshot, claim, read_snapshot, write_over
from rigging.lease import Lease, ProcessIdentity
from rigging.log import get_logger
from rigging.regular_files import refused_entries
from zephyr.output_checksums import MANIFEST_NAME, write_checksums

from marin.errors import MarinError
from marin.execution.artifact import save_artifact
from marin.execution.records.executor_files import (
    INFO_FILE,
    LOCK_FILE,
    STATUS_FILE,
    STATUS_RUNNING,
    STATUS_SUCCESS,
    StatusRecord,
    status_from_dict,
    status_url,
)
from marin.execution.ownership.resumable_state import SELF_CHECKED_MARKERS

logger = get_logger("marin.execution.step_runner")

# An execution's staging folder sits beside the step's records, one level down: a step creates and
# removes one folder per execution, not two (a graph of thousands of small steps spends much of its
# time making and deleting inodes). Earlier versions nested it, ``.staging/g<N>``: still understood.
STAGING_PREFIX = ".staging-g"
LEGACY_STAGING_FOLDER = ".staging"
EXECUTIONS_FOLDER = ".executions"


def staging_generation(relative: str) -> int | None:
    """The generation whose staging folder ``relative`` (to the step folder) names: ``.staging-g<N>``,
    or ``.staging/g<N>`` as earlier versions named it; ``None`` for anything else."""
    if relative.startswith(STAGING_PREFIX):
        digits = relative[len(STAGING_PREFIX):]
    elif relative.startswith(f"{LEGACY_STAGING_FOLDER}/g"):
        digits = relative[len(LEGACY_STAGING_FOLDER) + 2:]
    else:
        return None
    return int(digits) if digits.isdigit() else None


def is_staging_entry(name: str) -> bool:
    """Whether ``name``, an entry of the step folder, holds what executions stage (either layout)."""
    return name == LEGACY_STAGING_FOLDER or staging_generation(name) is not None


class IrregularOutputError(MarinError, ValueError):
    """A step's output holds what the commit refuses: a special file, or a link out of the output or to nothing."""


def check_regular_output(work_path: str) -> None:
    """Refuse to commit what the readers of a step's output would refuse (:mod:`rigging.regular_files`):
    one line naming each special file (FIFO, device, socket) and each link that leads out of the
    output, to nothing, or to anything but a regular file. Checked before anything is hashed, since
    hashing opens every file (a FIFO blocks the open, ``/dev/zero`` never ends)."""
    refused = refused_entries(work_path)
    if refused:
        root = work_path.rstrip("/") + "/"
        named = "; ".join(f"{error.url.removeprefix(root)} is {error.reason}" for error in refused)
        raise IrregularOutputError(f"{work_path}: not committed, since an output may hold only regular files (and links "
                                   f"to them inside it); refused: {named}")


def read_ownership(output_path: str) -> tuple[Snapshot, StatusRecord | None]:
    """The step's status record with the version a claim must write over."""
    snapshot = read_snapshot(status_url(output_path))
    try:
        record = status_from_dict(snapshot.data) if snapshot.data is not None else None
    except (KeyError, TypeError, ValueError):
        record = None
    return snapshot, record


@dataclass(frozen=True)
class Execution:
    """One execution of one step: the fence it holds on the step's record and the folder it writes."""

    output_path: str
    fence: Fence
    staging: str  # relative to output_path

    @property
    def generation(self) -> int:
        return self.fence.generation

    @property
    def work_path(self) -> str:
        """Where the step's function writes: this execution's staging folder."""
        return fsx.join(self.output_path, self.staging)

    def to_json(self) -> dict[str, Any]:
        return {"output_path": self.output_path, "generation": self.generation, "owner": self.fence.owner, "staging": self.staging}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Execution:
        url = status_url(data["output_path"])
        return cls(data["output_path"], Fence(url, int(data["generation"]), str(data["owner"])), str(data["staging"]))

    @classmethod
    def of_record(cls, output_path: str, record: StatusRecord) -> Execution:
        """The execution a record names (to act for it, as a runner that adopts its live job does)."""
        return cls(output_path, Fence(status_url(output_path), record.generation, record.owner or ""),
                   record.staging or _staging_for(record.generation))

    def check(self) -> StatusRecord:
        """The record now; raises :class:`FencedOff` unless it names this execution, still RUNNING."""
        record = status_from_dict(self.fence.check().data or {})
        if record.status != STATUS_RUNNING:
            raise FencedOff(f"execution g{self.generation} of {self.output_path} was ended ({record.status}); it must stop")
        return record

    def write(self, **fields: Any) -> StatusRecord:
        """Update the record while it names this execution (any status may be written, once)."""
        data = self.fence.update({**fields, "time": time.time()}, condition=self._still_running)
        return status_from_dict(data)

    def _still_running(self, data: dict[str, Any]) -> str | None:
        if data.get("status") != STATUS_RUNNING:
            return f"execution g{self.generation} of {self.output_path} was already ended ({data.get('status')})"
        return None

    def commit(self, result: Any, *, step: str, identity: str, prefix: str | None) -> Any:
        """Make the staged output the step's and record SUCCESS; ``result`` with its paths moved too.

        Raises :class:`FencedOff`, having moved nothing, when another execution owns the step now.
        """
        # Durability (docs/engine.md, "What survives a machine crash"): the artifact, the checksums
        # and each status write below are fsynced before their rename, so after a machine crash a
        # record that says committing or SUCCESS never stands beside a lost artifact or manifest.
        if not _staged_anything(self.work_path):
            try:
                return self._commit_result(relocated(result, self.work_path, self.output_path), step=step,
                                           identity=identity, prefix=prefix)
            except CannotHoldError:
                pass  # storage that cannot hold the record: the commit through a commit point below
        check_regular_output(self.work_path)
        save_artifact(self.output_path, result, step=step, identity=identity, prefix=prefix, staged_in=self.work_path)
        self.check()
        # Moved in with the output, so a committed step with output files always has their manifest.
        write_checksums(self.work_path, self_checked=SELF_CHECKED_MARKERS)
        clear_stale_entries(self.output_path, self.staging)
        self.write(committing=True)  # the commit point: from here on anyone may finish the move
        promote(self.output_path, self.staging)
        self.fence.update({"status": STATUS_SUCCESS, "committing": False, "staging": None, "error": None, "time": time.time()})
        self._tidy_up()
        return relocated(result, self.work_path, self.output_path)

    def _commit_result(self, result: Any, *, step: str, identity: str, prefix: str | None) -> Any:
        """Commit an execution that staged no file: its artifact (``result``, its paths already moved
        to the step folder), written into the step folder, and SUCCESS, both while the record is held
        for this execution; ``result`` back. Raises :class:`CannotHoldError`, having written nothing,
        where the record cannot be held. With nothing to move there is no move to finish after a
        crash, so no commit point: cut short, the execution left no SUCCESS, and the artifact it may
        have left is replaced by the next execution's commit."""
        with self.fence.held(condition=self._still_running) as write:
            # A manifest left in the step folder from before describes files this output lacks.
            with contextlib.suppress(FileNotFoundError):
                os.remove(fsx.filesystem(fsx.join(self.output_path, MANIFEST_NAME))[1])
            save_artifact(self.output_path, result, step=step, identity=identity, prefix=prefix)
            write({"status": STATUS_SUCCESS, "committing": False, "staging": None, "error": None, "time": time.time()})
        fsx.remove_empty_folder(self.work_path)  # the folder a function given one left empty
        self._tidy_up()
        return result

    def _tidy_up(self) -> None:
        try:
            discard_stale_staging(self.output_path, self.generation)
        except Exception as exc:  # noqa: BLE001 - tidying up never fails a committed step
            logger.warning("Could not remove the staging folders of earlier executions of %s: %s", self.output_path, exc)


def _staged_anything(work_path: str) -> bool:
    """Whether the execution's staging folder holds anything (always True off local disk, where
    the commit through a commit point is the only one, so no listing is spent on the question)."""
    if not fsx.is_local(work_path):
        return True
    try:
        return bool(os.listdir(fsx.filesystem(work_path)[1]))
    except FileNotFoundError:
        return False  # never made: the step's function takes no folder


def _staging_for(generation: int) -> str:
    return f"{STAGING_PREFIX}{generation}"


def claim_execution(output_path: str, over: Snapshot, fields: dict[str, Any]) -> Execution | None:
    """Start a new execution over the record ``over`` (None when the record changed since it was read)."""
    staging = _staging_for(over.generation + 1)
    fence = claim(status_url(output_path), {**fields, "status": STATUS_RUNNING, "staging": staging, "committing": False,
                                            "error": None, "time": time.time()}, over)
    return None if fence is None else Execution(output_path, fence, staging)


def clear_stale_entries(output_path: str, staging: str) -> None:
    """Delete what the step folder holds under the names of the staged output's entries.

    Run before the commit point: nothing in the step folder is committed then, so whatever is there
    under those names is left over from an older layout or a failed run, and must not mix with the
    new output. After the commit point only :func:`promote` runs, which must stay idempotent.
    """
    fs, root = fsx.filesystem(output_path)
    root = root.rstrip("/")
    for name in {relative.split("/", 1)[0] for relative in fsx.find_files(fsx.join(output_path, staging))}:
        target = f"{root}/{name}"
        if not fsx.is_temporary_name(name) and fs.exists(target):
            fs.rm(target, recursive=True)


def promote(output_path: str, staging: str) -> None:
    """Move every file of ``<output_path>/<staging>`` to the same place under ``output_path``.

    Idempotent, so a commit cut short can be finished by anyone (see :func:`_move_entries`).
    Temporary files a killed writer left are not moved.
    """
    _move_entries(output_path, staging, "")
    legacy_parent = [LEGACY_STAGING_FOLDER] if staging.startswith(f"{LEGACY_STAGING_FOLDER}/") else []
    _remove_empty_folders(output_path, staging, *legacy_parent)


def _remove_empty_folders(output_path: str, *relatives: str) -> None:
    """Remove each folder of the step (in order) that holds no file any more."""
    fs, root = fsx.filesystem(output_path)
    for relative in relatives:
        folder = f"{root.rstrip('/')}/{relative}"
        if fsx.remove_empty_folder(fsx.join(output_path, relative)):
            continue  # the usual case, an emptied folder: one call instead of a walk
        try:
            if fs.exists(folder) and not fsx.find_files(fsx.join(output_path, relative)):
                fs.rm(folder, recursive=True)
        except FileNotFoundError:
            pass  # an object store has no folders: nothing is left once every file moved


def stage_unstaged_output(output_path: str, staging: str) -> list[str]:
    """Move what an execution that wrote the step folder directly left there into ``staging``.

    Such output comes from a version of the engine without staging folders (or a hand-made
    folder); moving it lets the new execution continue from it, as a training step resumes from
    its checkpoints. The engine's own records and any subfolder holding another step's output stay.
    The names moved are returned.
    """
    files = fsx.find_files(output_path)
    records = {STATUS_FILE, INFO_FILE, LOCK_FILE}
    other_steps = [folder for folder, _, name in (f.rpartition("/") for f in files) if folder and name in records]
    names = sorted({
        f.split("/", 1)[0] for f in files
        if f.split("/", 1)[0] not in records | {EXECUTIONS_FOLDER, ATTEMPTS_FOLDER}
        and not is_staging_entry(f.split("/", 1)[0])
        and not fsx.is_temporary_name(f.split("/", 1)[0])
    })
    names = [name for name in names if not any(folder == name or folder.startswith(name + "/") for folder in other_steps)]
    _move_entries(output_path, "", staging, only=names)
    return names


def _move_entries(output_path: str, source: str, target: str, only: list[str] | None = None) -> None:
    """Move the entries of one folder of the step (relative; "" is the step folder) into another.

    On local disk each top-level entry is renamed (one call, whatever its size; an entry is either
    still in the source or moved, and a same-named one in the target is replaced); on object stores
    every file is copied (server-side), and the sources are deleted only once every copy is done, so
    a move cut short is finished by doing it again.
    """
    fs, root = fsx.filesystem(output_path)
    root = root.rstrip("/")
    source_path = f"{root}/{source}".rstrip("/")
    target_path = f"{root}/{target}".rstrip("/")
    if fsx.is_local(output_path):
        try:
            names = sorted(os.listdir(source_path))
        except FileNotFoundError:
            return
        for name in names:
            if not fsx.is_temporary_name(name) and (only is None or name in only):
                _rename_over(f"{source_path}/{name}", target_path, name)
        return
    fs.invalidate_cache(source_path)
    files = [name for name in fsx.find_files(fsx.join(output_path, source) if source else output_path)
             if not any(map(fsx.is_temporary_name, name.split("/")))
             and (only is None or name.split("/", 1)[0] in only)]
    if files:
        fs.copy([f"{source_path}/{name}" for name in files], [f"{target_path}/{name}" for name in files])
        fs.rm([f"{source_path}/{name}" for name in files])


def _rename_over(source: str, folder: str, name: str) -> None:
    """Rename the local ``source`` to ``folder/name``, replacing what is there (a file or a folder,
    which a rename cannot replace when it is not empty) and making ``folder`` if it is missing."""
    destination = f"{folder}/{name}"
    try:
        os.replace(source, destination)
        return
    except FileNotFoundError:
        if os.path.isdir(folder) or not os.path.lexists(source):
            raise
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:  # a folder (not empty) where a file or folder goes, or a file where a folder goes
        if exc.errno not in (errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST):
            raise
        if os.path.isdir(destination) and not os.path.islink(destination):
            shutil.rmtree(destination)
        else:
            os.remove(destination)
    os.replace(source, destination)


def discard_stale_staging(output_path: str, generation: int) -> list[str]:
    """Delete the staging folders that executions before ``generation`` left, once each of their
    replicas is known to have stopped (an execution in a runner has none: the runner that superseded
    it holds the lease its runner lost). A folder a replica may still write stays, as it must; the
    next commit looks again. The folders removed (relative to the step folder) are returned."""
    if generation <= 1:
        return []  # the first execution of the step: none came before it
    fs, root = fsx.filesystem(output_path)
    removed = []
    for staging in staging_folders(output_path):
        earlier = staging_generation(staging)
        if earlier is None or earlier >= generation:
            continue
        beats = replica_heartbeats(output_path, earlier)
        if all(beat.known_stopped() for beat in beats):
            fs.rm(f"{root.rstrip('/')}/{staging}", recursive=True)
            removed.append(staging)
        else:
            logger.info("Left %s/%s: a replica of that execution may still write there", output_path, staging)
    if any(staging.startswith(f"{LEGACY_STAGING_FOLDER}/") for staging in removed):
        _remove_empty_folders(output_path, LEGACY_STAGING_FOLDER)
    return removed


def staging_folders(output_path: str) -> list[str]:
    """Every staging folder in the step folder, relative to it (either layout), sorted."""
    names = _entry_names(output_path)
    found = [name for name in names if staging_generation(name) is not None]
    if LEGACY_STAGING_FOLDER in names:
        nested = (f"{LEGACY_STAGING_FOLDER}/{name}" for name in _entry_names(fsx.join(output_path, LEGACY_STAGING_FOLDER)))
        found += [name for name in nested if staging_generation(name) is not None]
    return sorted(found)


def _entry_names(url: str) -> list[str]:
    """The names directly inside the folder ``url`` (none when it does not exist)."""
    fs, path = fsx.filesystem(url)
    try:
        if fsx.is_local(url):
            return os.listdir(path)
        fs.invalidate_cache(path)
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def roll_forward(output_path: str, over: Snapshot, record: StatusRecord) -> bool:
    """Finish a commit that was cut short (the record says ``committing``); True once SUCCESS is recorded."""
    if record.staging:
        promote(output_path, record.staging)
    data = {**(over.data or {}), "status": STATUS_SUCCESS, "committing": False, "staging": None, "time": time.time()}
    if write_over(status_url(output_path), over, data):
        logger.info("Finished the commit of execution g%d that was cut short: %s", record.generation, output_path)
        return True
    _, now = read_ownership(output_path)
    return now is not None and now.status == STATUS_SUCCESS


def relocated(value: Any, old: str, new: str) -> Any:
    """``value`` with every string path under ``old`` moved under ``new`` (dataclasses, dicts, lists, tuples)."""
    old = old.rstrip("/")
    if isinstance(value, str):
        if value == old:
            return new
        return new + value[len(old):] if value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {key: relocated(item, old, new) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(relocated(item, old, new) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: relocated(getattr(value, f.name), old, new) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


def latest_work_path(output_path: str) -> str:
    """Where the step's latest execution keeps its files: its staging folder while it runs or after
    it stopped short (a training step's checkpoints and metrics are there), the step folder once
    committed. For readers that follow a step in progress."""
    _, record = read_ownership(output_path)
    if record is not None and record.staging and record.status != STATUS_SUCCESS:
        staged = fsx.join(output_path, record.staging)
        if fsx.exists(staged):
            return staged
    return output_path


def has_live_writer(output_path: str, record: StatusRecord, lease: Lease | None = None) -> bool:
    """Whether anything may still write the RUNNING execution ``record`` names: the runner's lease
    on the step is live, or a replica of the execution still heartbeats. ``lease`` is a reader's
    :class:`~rigging.lease.Lease` on the step's lock, kept between calls (it judges a heartbeat
    from the future by how long it stays unchanged)."""
    lease = lease or Lease(fsx.join(output_path, LOCK_FILE))
    if not lease.is_stale(lease.read()):
        return True
    return any(beat.may_be_running() for beat in replica_heartbeats(output_path, record.generation))


# -- replicas that run elsewhere --------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaHeartbeat:
    """``.executions/g<generation>-replica-<i>.json``: a replica of an execution, as it last said."""

    generation: int
    replica: int
    process: ProcessIdentity
    heartbeat_at: float
    ttl_s: float
    ended: bool = False
    finished: bool = False  # its function returned: its share of the output is written
    slurm_job: str | None = None  # the Slurm job it runs in, if any: what ends it from any machine

    def may_be_running(self, now: float | None = None) -> bool:
        """Whether it may still write: not ended, and alive here or heartbeating within its TTL."""
        if self.ended:
            return False
        alive = self.process.alive_here()
        if alive is not None:
            return alive
        return (time.time() if now is None else now) - self.heartbeat_at <= self.ttl_s

    def known_stopped(self) -> bool:
        """Whether it certainly writes no more: it said so, or it was a process of this machine that is gone."""
        return self.ended or self.process.alive_here() is False

    def describe(self) -> str:
        where = f", Slurm job {self.slurm_job}" if self.slurm_job else ""
        return f"replica {self.replica} (pid {self.process.pid} on {self.process.host}{where})"


def heartbeat_url(output_path: str, generation: int, replica: int) -> str:
    return fsx.join(output_path, EXECUTIONS_FOLDER, f"g{generation}-replica-{replica:03d}.json")


def replica_heartbeats(output_path: str, generation: int) -> list[ReplicaHeartbeat]:
    """Every heartbeat the replicas of execution ``generation`` left (none for executions in a runner)."""
    found = []
    for name in fsx.find_files(fsx.join(output_path, EXECUTIONS_FOLDER)):
        if not (name.startswith(f"g{generation}-replica-") and name.endswith(".json")):
            continue
        text = fsx.read_text(fsx.join(output_path, EXECUTIONS_FOLDER, name))
        try:
            data = json.loads(text or "")
            found.append(ReplicaHeartbeat(
                generation=int(data["generation"]), replica=int(data["replica"]),
                process=ProcessIdentity(str(data["host"]), int(data["pid"]), data.get("pid_started"), data.get("pid_namespace")),
                heartbeat_at=float(data["heartbeat_at"]), ttl_s=float(data["ttl_s"]), ended=bool(data.get("ended")),
                finished=data.get("finished") is True, slurm_job=data.get("slurm_job") or None,
            ))
        except (ValueError, KeyError, TypeError):
            continue  # torn or foreign: says nothing about a live replica
    return found


class ReplicaWatch:
    """A replica's heartbeat and its check of the fence, every ``interval_s`` in a thread.

    ``on_fenced_off(reason)`` is called once when the record no longer names the execution as
    RUNNING (superseded, or ended by its runner): the replica must stop and commit nothing.
    """

    def __init__(self, execution: Execution, replica: int, interval_s: float, on_fenced_off: Callable[[str], None]) -> None:
        self.execution = execution
        self.replica = replica
        self.interval_s = interval_s
        self.on_fenced_off = on_fenced_off
        self.fenced_off: str | None = None
        self._finished = False
        self._process = ProcessIdentity.of_this_process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"fence-watch:g{execution.generation}", daemon=True)

    def __enter__(self) -> ReplicaWatch:
        self.beat()
        self.check()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 4 + 5)
        self.beat(ended=True)

    def beat(self, ended: bool = False) -> None:
        # A replica that misses three beats (and is not a process this machine can look at) counts as gone.
        record = {
            "generation": self.execution.generation, "replica": self.replica, "host": self._process.host,
            "pid": self._process.pid, "pid_started": self._process.started, "pid_namespace": self._process.namespace,
            "heartbeat_at": time.time(), "ttl_s": self.interval_s * 3 + 2, "ended": ended, "finished": self._finished,
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
        }
        try:
            fsx.atomic_write(heartbeat_url(self.execution.output_path, self.execution.generation, self.replica), json.dumps(record))
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat only makes the replica look older
            logger.warning("Replica %d: could not write its heartbeat: %s", self.replica, exc)

    def finished(self) -> None:
        """Say that this replica's function returned: its share of the output is in the staging folder."""
        self._finished = True
        self.beat()

    def wait_for_the_others(self, replicas: int, stopping: Callable[[], bool]) -> str | None:
        """On replica 0, before it commits: wait until each of the execution's ``replicas`` replicas
        has finished, since a multi-host step's output is only whole once each has written its share.
        ``None`` once they all have; otherwise why the output never will be (a replica ended without
        finishing, or stopped heartbeating), or that ``stopping()`` became true."""
        while True:
            beats = {beat.replica: beat for beat in replica_heartbeats(self.execution.output_path, self.execution.generation)}
            if all(index in beats and beats[index].finished for index in range(replicas)):
                return None
            for index, beat in sorted(beats.items()):
                if not beat.finished and not beat.may_be_running():
                    return f"{beat.describe()} ended without finishing its share of the output"
            if stopping():
                return "stopped while waiting for the other replicas to finish"
            time.sleep(min(0.2, self.interval_s))

    def check(self) -> None:
        if self.fenced_off is not None:
            return
        try:
            self.execution.check()
        except FencedOff as exc:
            self.fenced_off = str(exc)
            logger.error("Execution g%d was fenced off: %s; this replica stops and commits nothing", self.execution.generation, exc)
            self.on_fenced_off(str(exc))
        except Exception as exc:  # noqa: BLE001 - storage trouble: look again at the next beat
            logger.warning("Replica %d: could not read the step's record: %s", self.replica, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()
            self.check()
