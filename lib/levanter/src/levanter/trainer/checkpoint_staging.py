"""Checkpoints on storage Orbax cannot write itself (``s3://``, ``memory://``, ...): staged locally.

Orbax writes local folders and ``gs://`` (through TensorStore's ``file`` and ``gcs`` drivers) and
nothing else: given ``s3://bucket/x`` it fails with "Checkpoint path should be absolute". For every
other URL the :class:`~levanter.trainer.checkpoint.Checkpointer` lets Orbax write into a local
staging folder, and this module mirrors each committed step to the URL:

- **upload**: every file of ``<staging>/<step>/`` goes to ``<url>/<step>/``, and only then
  ``<url>/<step>/commit_success.txt`` (the name Orbax gives the marker of a committed step).
  A step is listed only once its marker exists, so a half-uploaded checkpoint (a run killed during
  the upload) is never listed or restored; its files are deleted by the next upload. The step's
  local copy is deleted once it is uploaded.
- **prune**: keep-last / keep-every on the URL; a pruned step loses its marker first, so a prune
  cut short leaves files that are never listed, not a listed step with missing files.
- **restore**: the step's files are downloaded into the staging folder, where Orbax reads them.

What it costs: local disk for one checkpoint (the one being written or read, in a folder under
``TMPDIR``), and an upload per save, which an asynchronous save runs in a background thread while
training continues. It works for a single process only: each process of a multi-process run would
stage a different part of the arrays.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from rigging import filesystem as fsx

from levanter.errors import LevanterError

logger = logging.getLogger(__name__)

COMMIT_MARKER = "commit_success.txt"
_COMMITTED = re.compile(rf"^(\d+)/{re.escape(COMMIT_MARKER)}$")
_STEP_FILE = re.compile(r"^(\d+)/")


class UploadError(LevanterError, RuntimeError):
    """A checkpoint committed in the staging folder could not be copied to its URL."""


def orbax_writes_natively(url: str) -> bool:
    """Whether Orbax reads and writes ``url`` itself: an absolute local path, or ``gs://``."""
    return "://" not in url or url.startswith("gs://")


class CheckpointStaging:
    """A local folder for Orbax and the mirror of its committed steps at ``url`` (see the module docstring).

    ``keep_last`` / ``keep_every`` prune the URL as Orbax prunes a local folder: the newest
    ``keep_last`` (None: all) and every step divisible by ``keep_every`` are kept.
    """

    def __init__(self, url: str, *, keep_last: int | None, keep_every: int | None):
        self.url = url
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.local_root = tempfile.mkdtemp(prefix="levanter-checkpoint-staging-")
        self._remove_local_root = weakref.finalize(self, shutil.rmtree, self.local_root, ignore_errors=True)
        # One long-lived thread: fsspec caches a filesystem per thread, so a thread per upload would
        # make (and keep) a new client each time. Its work is finished before the interpreter exits,
        # as Orbax's own writer threads' is.
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-upload")
        self._upload: Future | None = None

    def local_path_of(self, step: int) -> str:
        return os.path.join(self.local_root, str(step))

    # -- listing ------------------------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Steps whose upload completed (their marker exists), oldest first: one recursive listing."""
        return sorted(int(match.group(1)) for match in map(_COMMITTED.match, fsx.find_files(self.url)) if match)

    # -- upload -------------------------------------------------------------------------------------

    def upload_when_committed(self, step: int, wait_for_commit: Callable[[], None], *, asynchronous: bool) -> None:
        """Upload ``step`` once ``wait_for_commit`` returns (Orbax has committed it locally).

        Asynchronous: in a background thread; its failure is raised by the next :meth:`wait`.
        """

        def commit_then_upload() -> None:
            wait_for_commit()
            self._upload_step(step)

        if asynchronous:
            self._upload = self._uploader.submit(commit_then_upload)
        else:
            commit_then_upload()

    def wait(self) -> None:
        """Block until the upload in flight (if any) is done; raise its failure."""
        upload, self._upload = self._upload, None
        if upload is not None:
            upload.result()

    def _upload_step(self, step: int) -> None:
        try:
            self._copy_up(step)
        except Exception as e:
            raise UploadError(
                f"Checkpoint of step {step} could not be uploaded to {fsx.join(self.url, str(step))} "
                f"({type(e).__name__}: {e}); it is not listed there, so a rerun resumes from the checkpoint before it."
            ) from e
        self.discard_local(step)

    def _copy_up(self, step: int) -> None:
        started = time.monotonic()
        local = self.local_path_of(step)
        # Orbax leaves a marker of the same name in the step folder: it must not arrive before the other files.
        names = [name for name in fsx.find_files(local) if name != COMMIT_MARKER]
        total = sum(os.path.getsize(os.path.join(local, name)) for name in names)
        listing = fsx.find_files(self.url)
        committed = sorted({int(m.group(1)) for m in map(_COMMITTED.match, listing) if m})
        # Files of steps without a marker: uploads that never completed (this step's among them).
        unfinished = [name for name in listing if (m := _STEP_FILE.match(name)) and int(m.group(1)) not in committed]
        fsx.remove_files(self.url, unfinished)
        fsx.upload_files(local, names, fsx.join(self.url, str(step)))
        marker = {"step": step, "files": len(names), "bytes": total, "uploaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        fsx.atomic_write(fsx.join(self.url, str(step), COMMIT_MARKER), json.dumps(marker))
        logger.info(
            "Checkpoint of step %d uploaded to %s (%d files, %.1f MB) in %.2fs.",
            step, fsx.join(self.url, str(step)), len(names), total / 1e6, time.monotonic() - started,
        )
        self._prune(sorted({*committed, step}))

    def _prune(self, steps: list[int]) -> None:
        if self.keep_last is None:
            return
        newest = set(steps[-self.keep_last :])
        for step in steps:
            if step in newest or (self.keep_every and step % self.keep_every == 0):
                continue
            fsx.rm(fsx.join(self.url, str(step), COMMIT_MARKER))  # unlisted first
            fsx.rm(fsx.join(self.url, str(step)), recursive=True)

    # -- restore ------------------------------------------------------------------------------------

    def download(self, step: int) -> None:
        """Copy the committed ``step`` into the staging folder, where Orbax can read it."""
        started = time.monotonic()
        remote_url = fsx.join(self.url, str(step))
        names = fsx.find_files(remote_url)
        local = self.local_path_of(step)
        self.discard_local(step)
        for folder in {os.path.dirname(os.path.join(local, name)) for name in names}:
            os.makedirs(folder, exist_ok=True)
        fs, remote = fsx.filesystem(remote_url)
        fs.get([f"{remote}/{name}" for name in names], [os.path.join(local, name) for name in names])
        logger.info("Checkpoint of step %d downloaded from %s in %.2fs.", step, remote_url, time.monotonic() - started)

    def discard_local(self, step: int) -> None:
        shutil.rmtree(self.local_path_of(step), ignore_errors=True)

    def close(self) -> None:
        self.wait()
        self._uploader.shutdown()
        self._remove_local_root()
