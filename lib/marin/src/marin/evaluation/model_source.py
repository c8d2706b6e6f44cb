"""Where an eval step's model comes from: a training step's output, or a checkpoint folder.

A folder is identified by the content of its files (``config.json`` and the weights), never by its
path, so an eval step's hash is the same on every machine and changes when the weights do.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from rigging import filesystem as fsx

from marin.errors import MarinError

# Weight files above this size are identified by their size, head and tail instead of a full digest
# (reading many gigabytes when a step is *declared* would make every dry run slow).
_FULL_DIGEST_MAX_BYTES = 1 << 30
_SAMPLE_BYTES = 8 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".json")


class ModelSourceError(MarinError, ValueError):
    """The model given to an eval step cannot be evaluated as written."""


@dataclass(frozen=True)
class LoadedModel:
    model: Any
    model_type: str
    path: str


def checkpoint_folder_identity(path: str) -> dict[str, Any]:
    """``{"kind": "hf_checkpoint", "files": {name: digest}}`` for a Hugging Face checkpoint folder."""
    fs, root = fsx.filesystem(path)
    if not fs.exists(f"{root}/config.json"):
        raise ModelSourceError(
            f"{path} has no config.json: give evaluate_lm a train_lm(...) handle or a Hugging Face checkpoint folder "
            "(config.json + model.safetensors), such as the hf/ folder of a training step."
        )
    files = {}
    for entry in sorted(fs.ls(root, detail=False)):
        name = os.path.basename(entry.rstrip("/"))
        if name.endswith(_WEIGHT_SUFFIXES):
            files[name] = _digest(fs, entry)
    return {"kind": "hf_checkpoint", "files": files}


def _digest(fs: Any, path: str) -> str:
    size = int(fs.size(path) or 0)
    digest = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        if size <= _FULL_DIGEST_MAX_BYTES:
            for chunk in iter(lambda: handle.read(1 << 22), b""):
                digest.update(chunk)
            return f"sha256:{digest.hexdigest()}"
        digest.update(str(size).encode())
        digest.update(handle.read(_SAMPLE_BYTES))
        handle.seek(size - _SAMPLE_BYTES)
        digest.update(handle.read(_SAMPLE_BYTES))
    return f"sampled-sha256:{digest.hexdigest()}"


def load_hf_checkpoint(path: str) -> LoadedModel:
    """A Llama or Mixtral checkpoint folder in the Hugging Face format (local or a URL), as our model."""
    from levanter.compat.hf_checkpoints import import_from_hf

    model = import_from_hf(path)
    return LoadedModel(model=model, model_type=type(model).__name__, path=path)
