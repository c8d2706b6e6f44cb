"""Checkpoints of the whole train state with Orbax.

Why Orbax: it writes each checkpoint into a temporary directory and renames it into place only
once every array is on disk (a killed save leaves a ``*.orbax-checkpoint-tmp-*`` directory that is
never listed as a step and is cleaned up on the next start), saves sharded arrays from every
device without gathering them, restores straight into a requested sharding, and runs the disk
writes in a background thread so training continues while a checkpoint is written.

Layout: ``<directory>/<step>/state/...``; ``step`` counts optimizer updates, so resuming from
checkpoint ``k`` continues with batch index ``k`` of the data source.

Where: ``directory`` is a local path or any fsspec URL. Orbax writes local paths and ``gs://``
itself; for every other URL (``s3://``, ``memory://``, ...) it writes a local staging folder and each
committed step is uploaded with a commit marker written last, and downloaded again to be restored
(:mod:`levanter.trainer.checkpoint_staging`). Staging exists because Orbax (through TensorStore)
has no driver for those stores; it costs local disk for one checkpoint and an upload per save, which
an asynchronous save runs in the background. Listing, keep-last pruning, the set-aside below and the
disk-full report work the same on both paths.

What goes wrong on real disks is handled here, not in the trainer: every committed step gets a
manifest of its files' sizes and checksums (:mod:`levanter.trainer.checkpoint_manifest`), checked
before the step is restored; :meth:`Checkpointer.restore_latest` moves a committed checkpoint whose
files no longer read back (truncated, deleted, garbled) or no longer match their checksums (a
flipped bit, which Orbax would read as different numbers) aside to ``<step>.corrupt-<UTC time>``
with a WARNING and resumes from the one before it (a name Orbax never lists, so it is kept for
inspection but never picked again). A step without a manifest is treated the same way, since nothing
vouches for its files, unless the run allows unverified checkpoints: then it is restored with a
WARNING and named in :attr:`Checkpointer.restored_unverified`. A full disk during a save is reported as
:class:`CheckpointDiskFullError` instead of Orbax's error from its writer thread.

What a storage error means is decided in :mod:`levanter.trainer.checkpoint_errors`; the names the
state's arrays are stored under in :mod:`levanter.trainer.checkpoint_keys`. Reading another run's
checkpoint without changing it is :mod:`levanter.trainer.checkpoint_reading`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import orbax.checkpoint as ocp

from levanter.trainer.checkpoint_errors import (
    CheckpointDiskFullError,
    CheckpointError,
    UnreadableCheckpointError,
    is_disk_full,
    is_passing_trouble,
    root_cause,
)
from levanter.trainer.checkpoint_keys import flatten_state, unflatten_state
from levanter.trainer.checkpoint_manifest import MANIFEST_NAME, verify_manifest, write_manifest
from levanter.trainer.checkpoint_staging import COMMIT_MARKER, CheckpointStaging, UploadError, orbax_writes_natively
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)

# Orbax numbers each save with a process-wide counter (its OperationIdGenerator) that a save reads
# several times while it starts, and keys the signals its background commit waits for by that
# number. Two Checkpointers starting saves at once in one process (a sweep's steps running in
# threads) read each other's numbers: a commit then waits for a signal sent under another number,
# until Orbax's 300 s timeout, or the two saves write into each other's folders. A save starts (the
# synchronous part of Orbax's save) under this lock; the background writes still overlap.
_ORBAX_SAVE_STARTING = threading.Lock()


def _size(num_bytes: float) -> str:
    if num_bytes < 1000:
        return f"{num_bytes:.0f} B"
    for unit in ("KB", "MB", "GB"):
        num_bytes /= 1000
        if num_bytes < 1000:
            return f"{num_bytes:.1f} {unit}"
    return f"{num_bytes / 1000:.1f} TB"


def _move_folder(source: str, target: str) -> None:
    """Rename a folder; on an object store, which cannot rename, copy its files, then delete them."""
    fs, source_path = fsx.filesystem(source)
    target_path = fsx.filesystem(target)[1]
    if fsx.is_local(source):
        fs.mv(source_path, target_path, recursive=True)
        return
    names = fsx.find_files(source)
    fs.copy([f"{source_path}/{name}" for name in names], [f"{target_path}/{name}" for name in names])
    # The commit marker goes first, so a move cut short leaves a folder that is no longer listed as a step.
    fsx.remove_files(source, [name for name in names if name == COMMIT_MARKER])
    fsx.remove_files(source, [name for name in names if name != COMMIT_MARKER])


class Checkpointer:
    """Saves every ``every_steps`` steps and/or ``every_minutes`` minutes; keeps the newest
    ``keep_last`` (None: all) plus every step divisible by ``keep_every``.

    ``checksums``: write each step's checksum manifest and verify it on restore (False: neither,
    which only the benchmark of their cost wants). ``allow_unverified``: restore a step that has no
    manifest (written before manifests existed, or cut off between its commit and its manifest)
    instead of setting it aside as damaged.

    ``restored_unverified``: the step folder the last successful restore read without verifying its
    files (None when they were verified).
    """

    def __init__(
        self,
        directory: str,
        *,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        keep_last: int | None = 2,
        keep_every: int | None = None,
        asynchronous: bool = True,
        checksums: bool = True,
        allow_unverified: bool = False,
    ):
        self.directory = fsx.absolute(directory)
        self._checksums = checksums
        self._allow_unverified = allow_unverified
        self.restored_unverified: str | None = None
        # Native saves write their manifest here once committed (staged ones in the upload thread).
        self._sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-checksums")
        self._sealing: Future | None = None
        self.every_steps = every_steps
        self.every_minutes = every_minutes
        self._asynchronous = asynchronous
        self._last_save_time = time.monotonic()
        self._staging: CheckpointStaging | None = None
        if not orbax_writes_natively(self.directory):
            if jax.process_count() > 1:
                raise CheckpointError(
                    f"Checkpoints in {self.directory} are staged through a local folder, which works for one "
                    f"process only; this run has {jax.process_count()}. Use a gs:// or shared local output folder."
                )
            # The URL is pruned by the staging; Orbax only ever holds the step being written or read.
            self._staging = CheckpointStaging(self.directory, keep_last=keep_last, keep_every=keep_every)
            keep_last = keep_every = None
            logger.info(
                "Checkpoints for %s are written in the local folder %s first (Orbax cannot write there itself), "
                "then uploaded.", self.directory, self._staging.local_root,
            )
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep_last,
            keep_period=keep_every,
            create=True,
            # A staging folder starts empty; its clean-up thread would only race the folder's removal.
            cleanup_tmp_directories=self._staging is None,
            enable_async_checkpointing=asynchronous,
        )
        # Naming the handler up front lets a fresh manager (a resumed run) read metadata before restoring.
        self._manager = ocp.CheckpointManager(
            self.directory if self._staging is None else self._staging.local_root,
            options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler()},
        )
        # Orbax removes the temporary folders of saves cut short in a thread of its own, which its
        # manager waits for only before its own first save. Another checkpointer on the folder (a new
        # run's, a reader's) would otherwise still be deleting when this one's save starts writing
        # its temporary folder, and delete that too. So the clean-up ends here.
        getattr(self._manager, "_maybe_await_cleanup_tmp_directory", lambda: None)()

    # -- policy ---------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether the state after ``step`` updates should be saved by the step/time policy."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        if self.every_minutes is not None and time.monotonic() - self._last_save_time >= 60 * self.every_minutes:
            return True
        return False

    # -- save / restore ---------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> None:
        with self._writing():  # the previous save's manifest and upload; they finish before Orbax writes again
            self._finish_sealing()
        if step in self.all_steps():
            return
        flat, _ = flatten_state(state)
        started = time.monotonic()
        with self._writing():  # an asynchronous save's failure surfaces in the next save (or wait)
            with _ORBAX_SAVE_STARTING:
                self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(flat)), force=True)
            if self._staging is not None:
                self._staging.upload_when_committed(step, lambda: self._seal(step), asynchronous=self._asynchronous)
            elif self._asynchronous:
                self._sealing = self._sealer.submit(self._seal, step)
            else:
                self._seal(step)
        self._last_save_time = time.monotonic()
        logger.info("Checkpoint of step %d handed to the writer in %.2fs (%s).", step, time.monotonic() - started, self.directory)

    def _seal(self, step: int) -> None:
        """Once Orbax has committed ``step``, write its checksum manifest (before a staged step is uploaded)."""
        self._manager.wait_until_finished()
        if self._checksums and jax.process_index() == 0:  # the commit is the primary's, with every process's files
            folder = self.path_of(step) if self._staging is None else self._staging.local_path_of(step)
            write_manifest(folder, exclude=(COMMIT_MARKER,))

    def _finish_sealing(self) -> None:
        if self._staging is not None:
            self._staging.wait()
        sealing, self._sealing = self._sealing, None
        if sealing is not None:
            sealing.result()

    def all_steps(self) -> list[int]:
        if self._staging is not None:
            return self._staging.committed_steps()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        if self._staging is not None:
            steps = self._staging.committed_steps()
            return steps[-1] if steps else None
        return self._manager.latest_step()

    def path_of(self, step: int) -> str:
        return fsx.join(self.directory, str(step))

    def restore(self, step: int, template: Any) -> Any:
        """The state saved at ``step``, with ``template``'s structure, dtypes and shardings.

        Raises :class:`UnreadableCheckpointError` when its files are damaged, and
        :class:`CheckpointError` when it holds another model/optimizer or its storage cannot be
        reached.
        """
        flat_template, _ = flatten_state(template)
        abstract = {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=getattr(v, "sharding", None))
            for k, v in flat_template.items()
        }
        self.restored_unverified = None
        if self._staging is None:
            verified = self._verify(step, self.path_of(step))
            restored = unflatten_state(self._restore_flat(step, abstract), template)
        else:
            self._download(step)
            try:
                verified = self._verify(step, self._staging.local_path_of(step))  # the download, so the copy is checked too
                restored = unflatten_state(self._restore_flat(step, abstract), template)
            finally:
                self._staging.discard_local(step)
                self._manager.reload()
        if not verified:
            self.restored_unverified = self.path_of(step)
        return restored

    def _restore_flat(self, step: int, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        with self._reading(step):
            stored = self._manager.item_metadata(step)["state"]
        self._check_matches(step, abstract, getattr(stored, "tree", stored))
        # Names, shapes and dtypes match, so a failure from here on is in the files themselves.
        with self._reading(step):
            restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        return restored["state"]

    def _verify(self, step: int, folder: str) -> bool:
        """Whether the step's files were verified; raise :class:`UnreadableCheckpointError` when they
        differ from its manifest, or when it has none and unverified checkpoints are not allowed."""
        if not self._checksums:
            return False
        with self._reading(step):
            verification = verify_manifest(folder, exclude=(COMMIT_MARKER,))
        if not verification.has_manifest:
            why = (f"it has no {MANIFEST_NAME} (written before checkpoints carried one, or the run stopped between "
                   "its commit and the manifest), so nothing shows its files are the ones written")
            if not self._allow_unverified:
                raise UnreadableCheckpointError(
                    f"Checkpoint {self.path_of(step)} cannot be read: {why} (set allow_unverified_checkpoints=True "
                    "in the trainer config to resume from it anyway)."
                )
            logger.warning("Checkpoint %s is restored unverified: %s; allow_unverified_checkpoints is set.",
                           self.path_of(step), why)
            return False
        if verification.problems:
            problems = verification.problems
            shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
            raise UnreadableCheckpointError(
                f"Checkpoint {self.path_of(step)} cannot be read: {shown} (its files changed after it was written: "
                "disk or copy corruption, or an edit)."
            )
        logger.info(
            "Checkpoint %s verified: %d files, %s in %.2fs.",
            self.path_of(step), verification.files, _size(verification.num_bytes), verification.seconds,
        )
        return True

    def _download(self, step: int) -> None:
        # Failing to copy a listed step says nothing about its files: it is left in place, not set aside.
        try:
            self._staging.download(step)
        except Exception as e:
            raise CheckpointError(
                f"Checkpoint {self.path_of(step)} could not be downloaded ({root_cause(e)}); it was left in place. "
                "Check that its storage is reachable and run again."
            ) from e
        self._manager.reload()

    def restore_latest(self, template: Any) -> tuple[int, Any] | None:
        """``(step, state)`` of the newest checkpoint that reads back; None when there is none.

        A damaged checkpoint is moved aside (see the module docstring) with a WARNING naming it,
        and the one before it tried; when none is left, training starts from scratch, with a
        WARNING saying so. A checkpoint of another model or optimizer still raises
        :class:`CheckpointError`: an older one would not match either, and it is not damaged.
        """
        set_aside = []
        for step in reversed(self.all_steps()):
            try:
                return step, self.restore(step, template)
            except UnreadableCheckpointError as e:
                if jax.process_count() > 1:
                    # Each process reads its own shards, so they may disagree on which checkpoint is
                    # good; falling back on their own could resume them from different steps.
                    raise CheckpointError(
                        f"{e} This run has {jax.process_count()} processes, which cannot agree on falling back "
                        f"by themselves: move it aside (mv {self.path_of(step)} {self.path_of(step)}.corrupt) and run again."
                    ) from e
                set_aside.append(self._set_aside(step, e))
        if set_aside:
            logger.warning(
                "No checkpoint in %s could be read (%s kept for inspection); training starts from scratch at step 0.",
                self.directory, ", ".join(set_aside),
            )
        return None

    def _set_aside(self, step: int, error: UnreadableCheckpointError) -> str:
        """Rename an unreadable step folder to ``<step>.corrupt-<UTC time>``; returns the new path."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = f"{self.path_of(step)}.corrupt-{stamp}"
        suffix = 1
        while fsx.exists(target):
            target = f"{self.path_of(step)}.corrupt-{stamp}-{suffix}"
            suffix += 1
        try:
            _move_folder(self.path_of(step), target)
        except Exception as e:  # OSError from disks, the store client's own errors from object stores
            # Left where it is, the step would be tried first again, and never saved again.
            raise CheckpointError(
                f"{error} Moving it aside to {target} failed ({e}); move or delete it yourself and run again."
            ) from e
        self._manager.reload()  # forget the step, so that it is neither restored nor garbage-collected
        logger.warning("%s Moved it to %s (kept for inspection) and trying the checkpoint before it.", error, target)
        return target

    @contextlib.contextmanager
    def _reading(self, step: int) -> Iterator[None]:
        """Turn the reader's errors into an unreadable checkpoint, unless the storage was only out of reach."""
        try:
            yield
        except CheckpointError:
            raise
        except Exception as e:
            if is_passing_trouble(e):
                raise CheckpointError(
                    f"Checkpoint {self.path_of(step)} could not be read ({root_cause(e)}); it was left in place. "
                    "Check that its storage is reachable and run again."
                ) from e
            raise UnreadableCheckpointError(f"Checkpoint {self.path_of(step)} cannot be read: {root_cause(e)}.") from e

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Report a full disk as such; Orbax raises it from its writer thread as an OSError or a
        TensorStore ValueError, with the writer's asyncio internals in the traceback."""
        try:
            yield
        except UploadError as e:
            raise CheckpointError(str(e)) from e
        except Exception as e:
            if is_disk_full(e):
                raise CheckpointDiskFullError(self._disk_full_message()) from e
            raise

    def _disk_full_message(self) -> str:
        where, local_disk = self.directory, self.directory if fsx.is_local(self.directory) else None
        bigger_disk = "give the run an output folder on a bigger disk"
        if self._staging is not None:
            where = local_disk = self._staging.local_root
            where += f" (the local staging folder of {self.directory})"
            bigger_disk = "point TMPDIR at a bigger disk (checkpoints for object stores are staged under it)"
        if local_disk is not None:
            with contextlib.suppress(OSError):  # the figure helps; its absence must not hide the error
                usage = shutil.disk_usage(local_disk)
                where += f" ({_size(usage.free)} free of {_size(usage.total)})"
        # Orbax lists a step only once its save is committed (and the staging once its upload is),
        # so the newest listed one is whole.
        self._manager.reload()
        newest = self.latest_step()
        if newest is None:
            kept = "There is no complete checkpoint yet."
        else:
            kept = f"The newest complete checkpoint is step {newest}, and a rerun resumes from it.{self._size_note(newest)}"
        return (
            f"Disk full: a checkpoint could not be written to {where}. {kept} Free space there (delete old runs, "
            f"or keep fewer checkpoints with keep_last_checkpoints) or {bigger_disk}, then run again; the "
            "half-written checkpoint is removed when the next run starts."
        )

    def _size_note(self, step: int) -> str:
        total = 0
        try:
            if fsx.is_local(self.directory):
                for folder, _, files in os.walk(self.path_of(step)):
                    total += sum(os.path.getsize(os.path.join(folder, name)) for name in files)
            else:
                fs, path = fsx.filesystem(self.path_of(step))
                total = fs.du(path)
        except Exception:  # the figure helps; failing to get it must not hide the disk-full error
            return ""
        return f" Each checkpoint takes about {_size(total)}."

    def _check_matches(self, step: int, abstract: dict[str, jax.ShapeDtypeStruct], stored: Any) -> None:
        """Compare names, shapes and dtypes with the stored metadata first, so a mismatch is one
        clear error instead of a failure deep inside the restore's worker tasks."""
        if not isinstance(stored, Mapping) or not all(hasattr(v, "shape") and hasattr(v, "dtype") for v in stored.values()):
            raise UnreadableCheckpointError(
                f"Checkpoint {self.path_of(step)} cannot be read: its metadata does not list the saved arrays."
            )
        problems = []
        for name in sorted(set(abstract) | set(stored)):
            if name not in stored:
                problems.append(f"{name}: missing from the checkpoint")
            elif name not in abstract:
                problems.append(f"{name}: in the checkpoint but not in this run's state")
            elif tuple(stored[name].shape) != tuple(abstract[name].shape) or stored[name].dtype != abstract[name].dtype:
                problems.append(
                    f"{name}: stored {tuple(stored[name].shape)} {stored[name].dtype}, "
                    f"expected {tuple(abstract[name].shape)} {abstract[name].dtype}"
                )
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise CheckpointError(
                f"Checkpoint {self.path_of(step)} does not match this run's model/optimizer: {shown}. "
                "Point the run at a fresh output folder or use the same configuration."
            )

    def wait(self) -> None:
        """Block until every started save is committed to disk (and uploaded, when staged)."""
        with self._writing():
            self._finish_sealing()
            self._manager.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self._manager.close()
        self._sealer.shutdown()
        if self._staging is not None:
            self._staging.close()
