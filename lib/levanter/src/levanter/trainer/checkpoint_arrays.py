"""Every array of a committed checkpoint step, by name, without a model or a template.

For tools that look inside a checkpoint rather than resume from it (comparing two runs' checkpoints
tensor by tensor, say): :func:`open_checkpoint_arrays` lists the stored arrays with their shapes and
dtypes from Orbax's metadata and reads the ones asked for as host NumPy arrays, so comparing two
checkpoints holds a bounded group of arrays in memory, never two whole train states. Remote checkpoints that Orbax
cannot read in place are downloaded once, as a resumed run downloads them
(:mod:`levanter.trainer.checkpoint_staging`). Nothing in the checkpoint's folder is written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from levanter.trainer.checkpoint_errors import CheckpointError
from levanter.trainer.checkpoint_reading import readable_copy, reading_foreign


@dataclass(frozen=True)
class StoredArray:
    shape: tuple[int, ...]
    dtype: np.dtype


class CheckpointArrays:
    """The arrays of one checkpoint step: :attr:`stored` (name -> shape and dtype) and :meth:`read`."""

    def __init__(self, step_url: str, state_dir: epath.Path, handler: ocp.PyTreeCheckpointHandler):
        self.step_url = step_url
        self._state_dir = state_dir
        self._handler = handler
        with reading_foreign(step_url):
            metadata = handler.metadata(state_dir)
        tree = getattr(metadata, "tree", metadata)
        if not isinstance(tree, dict) or not all(hasattr(v, "shape") and hasattr(v, "dtype") for v in tree.values()):
            raise CheckpointError(f"Checkpoint {step_url} cannot be read: its metadata does not list the saved arrays.")
        self.stored = {name: StoredArray(tuple(meta.shape), np.dtype(meta.dtype)) for name, meta in tree.items()}

    def read(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The arrays ``names`` as host NumPy arrays (only those are read, in one pass)."""
        missing = [name for name in names if name not in self.stored]
        if missing:
            raise CheckpointError(f"Checkpoint {self.step_url} holds no array named {missing[0]!r}.")
        args = ocp.args.PyTreeRestore(
            item={name: 0 for name in names},
            restore_args={name: ocp.RestoreArgs(restore_type=np.ndarray) for name in names},
            partial_restore=True,
        )
        with reading_foreign(self.step_url):
            restored = self._handler.restore(self._state_dir, args=args)
        return {name: np.asarray(restored[name]) for name in names}


@contextlib.contextmanager
def open_checkpoint_arrays(step_url: str) -> Iterator[CheckpointArrays]:
    """The arrays of the checkpoint step folder ``step_url`` (``<checkpoints>/<step>``, local or any URL).

    Raises :class:`~levanter.trainer.checkpoint_errors.CheckpointError` when it is not a checkpoint step
    folder or cannot be read.
    """
    with readable_copy(step_url) as local_step:
        handler = ocp.PyTreeCheckpointHandler()
        try:
            yield CheckpointArrays(step_url, epath.Path(local_step) / "state", handler)
        finally:
            handler.close()


__all__ = ["CheckpointArrays", "StoredArray", "open_checkpoint_arrays"]
