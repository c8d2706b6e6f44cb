"""Checkpoints of the whole train state with Orbax.

Why Orbax: it writes each checkpoint into a temporary directory and renames it into place only
once every array is on disk (a killed save leaves a ``*.orbax-checkpoint-tmp-*`` directory that is
never listed as a step and is cleaned up on the next start), saves sharded arrays from every
device without gathering them, restores straight into a requested sharding, and runs the disk
writes in a background thread so training continues while a checkpoint is written.

Layout: ``<directory>/<step>/state/...``; ``step`` counts optimizer updates, so resuming from
checkpoint ``k`` continues with batch index ``k`` of the data source.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read back into this run's state."""


def _flat_name(path) -> str:
    name = jax.tree_util.keystr(path)
    # Orbax uses the keys as parts of storage paths; keep them to a safe alphabet.
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", name).strip("._") or "root"


def flatten_state(state: Any) -> tuple[dict[str, jax.Array], Any]:
    """The state's array leaves as ``{readable path: array}`` and the treedef to rebuild it."""
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(state)
    flat: dict[str, jax.Array] = {}
    for path, leaf in leaves_with_paths:
        name = _flat_name(path)
        if name in flat:
            raise CheckpointError(f"Two state entries map to the checkpoint key {name!r}.")
        flat[name] = leaf
    return flat, treedef


def unflatten_state(flat: dict[str, Any], template: Any) -> Any:
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    return jax.tree_util.tree_unflatten(treedef, [flat[_flat_name(p)] for p, _ in leaves_with_paths])


class Checkpointer:
    """Saves every ``every_steps`` steps and/or ``every_minutes`` minutes; keeps the newest
    ``keep_last`` (None: all) plus every step divisible by ``keep_every``."""

    def __init__(
        self,
        directory: str,
        *,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        keep_last: int | None = 2,
        keep_every: int | None = None,
        asynchronous: bool = True,
    ):
        self.directory = os.path.abspath(directory)
        self.every_steps = every_steps
        self.every_minutes = every_minutes
        self._last_save_time = time.monotonic()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep_last,
            keep_period=keep_every,
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=asynchronous,
        )
        # Naming the handler up front lets a fresh manager (a resumed run) read metadata before restoring.
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers={"state": ocp.StandardCheckpointHandler()}
        )

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
        if step in self.all_steps():
            return
        flat, _ = flatten_state(state)
        started = time.monotonic()
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(flat)), force=True)
        self._last_save_time = time.monotonic()
        logger.info("Checkpoint of step %d handed to the writer in %.2fs (%s).", step, time.monotonic() - started, self.directory)

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def path_of(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def restore(self, step: int, template: Any) -> Any:
        """The state saved at ``step``, with ``template``'s structure, dtypes and shardings."""
        flat_template, _ = flatten_state(template)
        abstract = {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=getattr(v, "sharding", None))
            for k, v in flat_template.items()
        }
        self._check_matches(step, abstract)
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        except (KeyError, ValueError) as e:
            raise CheckpointError(
                f"Checkpoint {self.path_of(step)} does not match this run's model/optimizer ({e}). "
                "Point the run at a fresh output folder or use the same configuration."
            ) from e
        return unflatten_state(restored["state"], template)

    def _check_matches(self, step: int, abstract: dict[str, jax.ShapeDtypeStruct]) -> None:
        """Compare names, shapes and dtypes with the stored metadata first, so a mismatch is one
        clear error instead of a failure deep inside the restore's worker tasks."""
        stored = self._manager.item_metadata(step)["state"]
        stored = getattr(stored, "tree", stored)
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
        """Block until every started save is committed to disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
