"""Reading a checkpoint another run wrote, without changing it.

Another run's checkpoint can be a starting point: :func:`committed_steps` lists a ``checkpoints/``
folder, and :func:`read_state_fields` reads some fields of a step's state (the parameters, say,
without the optimizer state) into a run's own template. :func:`readable_copy` and
:func:`reading_foreign` are the two pieces every such reader shares (see also
:mod:`levanter.trainer.checkpoint_arrays`): a place Orbax can read the step from, and one
:class:`~levanter.trainer.checkpoint_errors.CheckpointError` for whatever the read raises. Nothing
in the checkpoint's folder is written.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from levanter.trainer.checkpoint_errors import CheckpointError, CheckpointMismatchError, root_cause
from levanter.trainer.checkpoint_keys import flat_name
from levanter.trainer.checkpoint_manifest import verify_manifest
from levanter.trainer.checkpoint_staging import COMMIT_MARKER, CheckpointStaging, orbax_writes_natively
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)


def committed_steps(directory: str) -> list[int]:
    """The committed steps of a ``checkpoints/`` folder (local or any URL), oldest first; nothing is written.

    Orbax renames a local step into place once complete, so there every number-named folder is
    whole; elsewhere (``gs://``, staged uploads) a step counts once its commit marker is there.
    """
    fs, root = fsx.filesystem(directory)
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    steps = []
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.isdigit() and (fsx.is_local(directory) or fs.exists(f"{entry.rstrip('/')}/{COMMIT_MARKER}")):
            steps.append(int(name))
    return sorted(steps)


def _selected(template: Any, fields: Sequence[str]) -> tuple[list[tuple[Any, Any]], list[bool]]:
    """The template's leaves with their paths, and whether each lies under one of ``fields``."""
    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(template)
    wanted = []
    for path, _leaf in leaves_with_paths:
        first = path[0] if path else None
        wanted.append(getattr(first, "name", getattr(first, "key", None)) in fields)
    return leaves_with_paths, wanted


def read_state_fields(step_url: str, template: Any, fields: Sequence[str]) -> Any:
    """``template`` with its arrays under the attributes ``fields`` (``("params",)``, say) read
    from the checkpoint step folder ``step_url`` (``<checkpoints>/<step>``, local or any URL).

    Only those arrays are read (the weights of a large model without its optimizer state), each
    into the sharding of its template leaf; the rest of ``template`` is returned as it is. Names,
    shapes and dtypes are compared with the stored metadata first, and a difference raises
    :class:`CheckpointMismatchError` listing them. Nothing in the checkpoint's folder is written.
    """
    leaves_with_paths, wanted = _selected(template, fields)
    abstract = {
        flat_name(path): jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=getattr(leaf, "sharding", None))
        for (path, leaf), take in zip(leaves_with_paths, wanted)
        if take
    }
    with readable_copy(step_url) as local_step:
        verification = verify_manifest(local_step, exclude=(COMMIT_MARKER,))
        if verification.problems:
            raise CheckpointError(f"Checkpoint {step_url} cannot be read: {'; '.join(verification.problems[:3])}.")
        if not verification.has_manifest:
            logger.warning("Checkpoint %s has no checksum manifest: its files are not verified.", step_url)
        state_dir = epath.Path(local_step) / "state"
        handler = ocp.PyTreeCheckpointHandler()
        try:
            with reading_foreign(step_url):
                stored = handler.metadata(state_dir)
            _check_subset(step_url, abstract, getattr(stored, "tree", stored), fields)
            restore_args = {
                name: ocp.ArrayRestoreArgs(sharding=spec.sharding, global_shape=spec.shape, dtype=spec.dtype)
                for name, spec in abstract.items()
            }
            with reading_foreign(step_url):
                restored = handler.restore(
                    state_dir, args=ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args, partial_restore=True)
                )
        finally:
            handler.close()
    leaves = [restored[flat_name(path)] if take else leaf for (path, leaf), take in zip(leaves_with_paths, wanted)]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)


@contextlib.contextmanager
def readable_copy(step_url: str) -> Iterator[str]:
    """``step_url`` where Orbax can read it: as it is when Orbax reads its storage, else a local copy
    (downloaded as a staged checkpoint is restored, see :mod:`levanter.trainer.checkpoint_staging`)."""
    directory, _, step = step_url.rstrip("/").rpartition("/")
    if not step.isdigit() or not fsx.exists(fsx.join(step_url, "state")):
        raise CheckpointError(f"{step_url} is not a checkpoint step folder (<checkpoints>/<step> holding state/).")
    if orbax_writes_natively(step_url):
        yield step_url
        return
    staging = CheckpointStaging(directory, keep_last=None, keep_every=None)
    try:
        try:
            staging.download(int(step))
        except Exception as e:
            raise CheckpointError(f"Checkpoint {step_url} could not be downloaded ({root_cause(e)}).") from e
        yield staging.local_path_of(int(step))
    finally:
        staging.close()


@contextlib.contextmanager
def reading_foreign(step_url: str) -> Iterator[None]:
    """Turn whatever reading another run's checkpoint ``step_url`` raises into a :class:`CheckpointError`."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"Checkpoint {step_url} cannot be read: {root_cause(e)}.") from e


def _check_subset(step_url: str, abstract: Mapping[str, jax.ShapeDtypeStruct], stored: Any, fields: Sequence[str]) -> None:
    if not isinstance(stored, Mapping):
        raise CheckpointError(f"Checkpoint {step_url} cannot be read: its metadata does not list the saved arrays.")
    problems = []
    for name, spec in abstract.items():
        if name not in stored:
            problems.append(f"{name}: missing from the checkpoint")
        elif tuple(stored[name].shape) != tuple(spec.shape) or stored[name].dtype != spec.dtype:
            problems.append(f"{name}: stored {tuple(stored[name].shape)} {stored[name].dtype}, expected {tuple(spec.shape)} {spec.dtype}")
    # Arrays of those fields that the run would leave behind (an untied output layer, another optimizer's moments).
    for name in sorted(stored):
        if name not in abstract and any(name == f or name.startswith((f"{f}.", f"{f}_")) for f in fields):
            problems.append(f"{name}: in the checkpoint but not in this run's state")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise CheckpointMismatchError(
            f"Checkpoint {step_url} does not match this run's {' and '.join(fields)}: {shown}.",
            {name: jax.ShapeDtypeStruct(tuple(meta.shape), meta.dtype) for name, meta in stored.items()},
        )
