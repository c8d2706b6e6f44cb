"""The files of a Hugging Face checkpoint folder, whatever model they hold.

A folder holds ``config.json``, the weights as one ``model.safetensors`` or as shards listed by
``model.safetensors.index.json``, and optionally the tokenizer's files. Folders are local paths or
any fsspec URL (``s3://``, ``gs://``, ``memory://``...): every file is written and read through
:mod:`rigging.filesystem`, and appears whole or not at all.

Reading refuses a damaged folder with :class:`CorruptCheckpointError` naming the file at fault: a
truncated or missing safetensors file, a ``config.json`` that is not JSON or lacks a field, and
tensors holding NaN or infinite values (a model loaded from them would only produce garbage).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, load_file, save, save_file

from rigging import filesystem as fsx

from levanter.errors import LevanterError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "tokenizer.model",
                   "vocab.json", "merges.txt")
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30

# One logger for the Hugging Face checkpoint modules: their lines name the public module.
logger = logging.getLogger("levanter.compat.hf_checkpoints")

# The config.json fields every supported family needs, with no default we could assume.
REQUIRED_CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


class HfFormatError(LevanterError, ValueError):
    """A checkpoint folder (or a model) that this package cannot read (or write) faithfully."""


class CorruptCheckpointError(HfFormatError):
    """A file of a checkpoint folder is damaged: truncated, missing, unparsable, or holds NaN/inf weights."""


# -- writing ----------------------------------------------------------------------------------------


def create_folder(url: str) -> None:
    """Make a local folder (object stores have none to make)."""
    if fsx.is_local(url):
        fsx.makedirs(url)


def write_weights(tensors: Iterable[tuple[str, np.ndarray]], out_dir: str, max_shard_bytes: int) -> tuple[int, int]:
    """Write named tensors as one ``model.safetensors``, or, past ``max_shard_bytes``, as numbered
    shards plus the index ``from_pretrained`` reads. Returns (bytes written, number of files)."""
    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, tensor in tensors:
        if shards[-1] and shard_bytes + tensor.nbytes > max_shard_bytes:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += tensor.nbytes
    total = sum(t.nbytes for shard in shards for t in shard.values())
    if len(shards) == 1:
        save_safetensors(shards[0], fsx.join(out_dir, WEIGHTS_FILE))
        return total, 1
    weight_map = {}
    started = time.monotonic()
    for i, shard in enumerate(shards):
        file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_safetensors(shard, fsx.join(out_dir, file_name))
        weight_map.update({name: file_name for name in shard})
        logger.info("Exported shard %d/%d (%.1fs elapsed)", i + 1, len(shards), time.monotonic() - started)
    write_json(fsx.join(out_dir, INDEX_FILE), {"metadata": {"total_size": total}, "weight_map": weight_map})
    return total, len(shards)


def save_safetensors(tensors: dict[str, np.ndarray], url: str) -> None:
    """Write one safetensors file; a crash never leaves a truncated file under the real name."""
    if fsx.is_local(url):
        path = fsx.absolute(url)
        save_file(tensors, path + ".tmp", metadata={"format": "pt"})  # streamed to disk, no copy in memory
        os.replace(path + ".tmp", path)
    else:  # an object store publishes an object only when its upload completes
        fsx.atomic_write(url, save(tensors, metadata={"format": "pt"}))


def write_json(url: str, value: Any) -> None:
    fsx.atomic_write(url, json.dumps(value, indent=2))


def write_tokenizer(tokenizer: Any, out_dir: str) -> list[str]:
    """Copy a tokenizer beside the weights exactly as it is: a ``tokenizers.Tokenizer`` (saved as
    ``tokenizer.json``), a ``tokenizer.json`` file, or a folder whose tokenizer files are copied byte
    for byte. Returns the names written. The metadata written beside them is
    :mod:`levanter.compat.hf_tokenizer_files`'s job."""
    if isinstance(tokenizer, (str, os.PathLike)):
        src = os.fspath(tokenizer)
        fs, path = fsx.filesystem(src)
        if fs.isfile(path):
            with fsx.open_url(src, "rb") as f:
                fsx.atomic_write(fsx.join(out_dir, TOKENIZER_JSON), f.read())
            return [TOKENIZER_JSON]
        found = [name for name in TOKENIZER_FILES if fsx.exists(fsx.join(src, name))]
        if not found:
            raise HfFormatError(f"No tokenizer files ({', '.join(TOKENIZER_FILES)}) in {src}.")
        for name in found:
            with fsx.open_url(fsx.join(src, name), "rb") as f:
                fsx.atomic_write(fsx.join(out_dir, name), f.read())
        return found
    if hasattr(tokenizer, "to_str"):  # a tokenizers.Tokenizer
        fsx.atomic_write(fsx.join(out_dir, TOKENIZER_JSON), tokenizer.to_str(pretty=True))  # as Tokenizer.save writes it
        return [TOKENIZER_JSON]
    raise TypeError(
        "tokenizer_dir_or_obj must be a folder, a tokenizer.json file or a tokenizers.Tokenizer, "
        f"got {type(tokenizer).__name__}."
    )


# -- reading ----------------------------------------------------------------------------------------


def read_json_object(file_path: str) -> dict:
    """A JSON file holding one object; :class:`CorruptCheckpointError` naming the file otherwise."""
    try:
        with fsx.open_url(file_path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise CorruptCheckpointError(
            f"{file_path} is not valid JSON ({e}); the checkpoint folder is damaged. Export or download it again."
        ) from e
    if not isinstance(value, dict):
        raise CorruptCheckpointError(
            f"{file_path} is not a JSON object (it holds a {type(value).__name__}); the checkpoint folder is damaged. "
            "Export or download it again."
        )
    return value


def read_hf_config(path: str | os.PathLike) -> dict:
    """The ``config.json`` of a checkpoint folder (a local path or any fsspec URL), as a dict."""
    config_path = fsx.join(os.fspath(path), CONFIG_FILE)
    if not fsx.exists(config_path):
        raise HfFormatError(f"No config.json in {os.fspath(path)}: not a Hugging Face checkpoint folder.")
    return read_json_object(config_path)


def read_model_config(path: str, standard_names: Callable[[dict], dict] | None = None) -> dict:
    """``config.json`` with the fields every family needs present and positive integers;
    ``standard_names`` first adds them under these names where a family spells them its own way."""
    config_path = fsx.join(path, CONFIG_FILE)
    hf = read_hf_config(path)
    hf = hf if standard_names is None else standard_names(hf)
    missing = [name for name in REQUIRED_CONFIG_FIELDS if name not in hf]
    if missing:
        raise CorruptCheckpointError(
            f"{config_path} lacks {', '.join(repr(m) for m in missing)}: the file is incomplete or not a model config. "
            "Export or download the checkpoint again."
        )
    wrong = [f"{name}={hf[name]!r}" for name in REQUIRED_CONFIG_FIELDS
             if isinstance(hf[name], bool) or not isinstance(hf[name], int) or hf[name] < 1]
    if wrong:
        raise CorruptCheckpointError(f"{config_path} has {', '.join(wrong)}; these fields must be positive integers.")
    return hf


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the folder's weight file(s), by name."""
    single = fsx.join(path, WEIGHTS_FILE)
    if fsx.exists(single):
        return load_safetensors(single)
    index = fsx.join(path, INDEX_FILE)
    if fsx.exists(index):
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CorruptCheckpointError(f"{index} has no 'weight_map' object; the checkpoint folder is damaged.")
        tensors: dict[str, np.ndarray] = {}
        for name in sorted(set(weight_map.values())):
            tensors.update(load_safetensors(fsx.join(path, name), named_by=index))
        return tensors
    raise HfFormatError(f"No {WEIGHTS_FILE} or {INDEX_FILE} in {path}; save the Hugging Face model with safe_serialization.")


def load_safetensors(file_path: str, *, named_by: str | None = None) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file, refusing a missing, unreadable or non-finite one."""
    if not fsx.exists(file_path):
        raise CorruptCheckpointError(
            f"{file_path} is missing" + (f" (named by {named_by})" if named_by else "")
            + "; the checkpoint folder is incomplete. Copy or export it again."
        )
    try:
        if fsx.is_local(file_path):
            tensors = load_file(fsx.absolute(file_path))  # memory-mapped
        else:
            with fsx.open_url(file_path, "rb") as f:
                tensors = load(f.read())
    except (SafetensorError, OSError) as e:
        raise CorruptCheckpointError(
            f"{file_path} is truncated or corrupt and cannot be read ({e}). Copy or export the checkpoint again."
        ) from e
    bad = sorted(name for name, tensor in tensors.items() if _non_finite(tensor))
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CorruptCheckpointError(
            f"{file_path} holds NaN or infinite values in {shown}; a model with these weights only produces "
            "garbage. Use an earlier checkpoint of the run (training diverged, or the file was damaged)."
        )
    return tensors


def _non_finite(tensor: np.ndarray) -> bool:
    if not jnp.issubdtype(tensor.dtype, jnp.floating):  # numpy alone does not count bfloat16 as floating
        return False
    # One pass and no temporary array: NaN and inf survive a sum, and a float64 sum of finite
    # values of 32 bits or fewer cannot overflow. Only a non-finite sum needs the exact check.
    with np.errstate(over="ignore"):  # float64 weights near their limit: the exact check decides
        if np.isfinite(tensor.sum(dtype=np.float64)):
            return False
    return not bool(np.isfinite(tensor).all())
