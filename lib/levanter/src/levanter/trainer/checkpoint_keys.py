"""The names a train state's arrays are stored under in a checkpoint.

A checkpoint holds a flat ``{name: array}`` mapping, each name the key path of one leaf of the
state in a safe alphabet (``params_layers_0_w`` for ``state.params["layers"][0]["w"]``), so a tool
can find an array by name without the model's code, and a run can read back only the fields it
asks for.
"""

from __future__ import annotations

import re
from typing import Any

import jax

from levanter.trainer.checkpoint_errors import CheckpointError


def flat_name(path) -> str:
    """The checkpoint name of the leaf at the key path ``path``."""
    name = jax.tree_util.keystr(path)
    # Orbax uses the keys as parts of storage paths; keep them to a safe alphabet.
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", name).strip("._") or "root"


def flatten_state(state: Any) -> tuple[dict[str, jax.Array], Any]:
    """The state's array leaves as ``{readable path: array}`` and the treedef to rebuild it."""
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(state)
    flat: dict[str, jax.Array] = {}
    for path, leaf in leaves_with_paths:
        name = flat_name(path)
        if name in flat:
            raise CheckpointError(f"Two state entries map to the checkpoint key {name!r}.")
        flat[name] = leaf
    return flat, treedef


def unflatten_state(flat: dict[str, Any], template: Any) -> Any:
    """``template`` with each leaf replaced by ``flat``'s array of the same name."""
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    return jax.tree_util.tree_unflatten(treedef, [flat[flat_name(p)] for p, _ in leaves_with_paths])
