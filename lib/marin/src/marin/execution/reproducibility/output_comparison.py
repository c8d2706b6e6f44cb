"""Compare a step's output folder with a rerun of it, file by file.

What is compared, and how (first the bytes; where they differ, the content, so the report says
*where* it differs):

* Orbax checkpoint steps (``<checkpoints>/<step>/``, all their files as one): array by array,
  never by bytes (their file names are random and their metadata carries times); the report names
  the first differing tensor and its largest absolute difference (:mod:`~marin.execution.reproducibility.tensor_diff`).
  Checkpoints saved by the clock (``minutes_per_checkpoint``) fall at other steps in each run, so
  a step only one run has is listed as unpaired, not as a difference; the newest checkpoint of
  each folder must be in both.
* ``.safetensors`` and ``.npz`` files: bytes, then tensor by tensor.
* Token-cache shards (a folder with ``shard.json`` and ``tokens.bin``): the first differing record
  (document), with the token position in it (:mod:`~marin.execution.reproducibility.record_diff`).
* JSON lines (``.jsonl``, compressed or not) and Parquet: the first differing record number and field.
* Other ``.json`` files: the first differing key. ``.artifact.json``: the result and its type,
  with its paths resolved; not who made it, when or where (its provenance).
* Anything else: the first differing byte offset.

Left out, because they say *when*, *where* or *by whom* a step ran, not what it computed:
:data:`CONTROL_FILES`, the temporaries of atomic writes, logs (``*.log``), the folders in
:data:`EXCLUDED_FOLDERS` (attempt logs; TensorBoard and W&B files, which stamp times), checkpoints
moved aside as unreadable (``<step>.corrupt-*``) and Orbax's unfinished saves. Inside JSON
records, :data:`MEASUREMENT_FIELDS` (times and rates) are not compared, and a path inside either
run's output folder or prefix is compared by its place there, so the two runs' locations do not
count as a difference.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rigging import filesystem as fsx
from zephyr.output_checksums import MANIFEST_NAME
from zephyr.token_cache.layout import LEDGER_NAME

from marin.execution.artifact import load_artifact
from marin.execution.records.executor_files import ARTIFACT_FILE, INFO_FILE, LOCK_FILE, STATUS_FILE
from marin.execution.reproducibility.record_diff import (
    byte_difference,
    json_difference,
    jsonl_difference,
    parquet_difference,
    same_bytes,
    token_shard_difference,
    value_difference,
)
from marin.execution.reproducibility.tensor_diff import checkpoint_difference, npz_difference, safetensors_difference

# The checksum manifest records the files (those left out below too); the files themselves are compared.
CONTROL_FILES = (STATUS_FILE, LOCK_FILE, INFO_FILE, MANIFEST_NAME)
EXCLUDED_FOLDERS = (".attempts", "tensorboard", "wandb")
# Measurements of how fast a run went, which no two runs share: left out of every JSON record.
MEASUREMENT_FIELDS = frozenset({"tokens_per_second", "mfu", "wall_time", "train_seconds"})
_LEFT_BEHIND = re.compile(r"^\d+\.corrupt-|\.orbax-checkpoint-tmp")
_JSONL = re.compile(r"\.jsonl(\.(gz|zst|bz2|xz))?$")


@dataclass(frozen=True)
class Placement:
    """Where each run's output (and the prefix it was written under) lies."""

    original_output: str
    rerun_output: str
    original_prefix: str
    rerun_prefix: str

    def normalizer(self) -> Callable[[Any], Any]:
        """A parsed record with measurements dropped and either run's paths written as ``<output>/...``
        or ``<prefix>/...``: the nearer base first, as artifacts store them."""
        roots = sorted(
            {
                (self.original_output.rstrip("/"), "<output>"),
                (self.rerun_output.rstrip("/"), "<output>"),
                (self.original_prefix.rstrip("/"), "<prefix>"),
                (self.rerun_prefix.rstrip("/"), "<prefix>"),
            },
            key=lambda pair: -len(pair[0]),
        )

        def normalize(value: Any) -> Any:
            if isinstance(value, str):
                for root, name in roots:
                    if value == root or value.startswith(root + "/"):
                        return name + value[len(root):]
                return value
            if isinstance(value, dict):
                return {k: normalize(v) for k, v in value.items() if k not in MEASUREMENT_FIELDS}
            if isinstance(value, list):
                return [normalize(v) for v in value]
            return value

        return normalize


@dataclass(frozen=True)
class FileDifference:
    path: str  # relative to the step's folder: a file, a checkpoint step or a token-cache shard
    what: str


@dataclass
class OutputComparison:
    files: int = 0  # files compared (a checkpoint's files each count)
    arrays: int = 0  # checkpoint and tensor-file arrays compared one by one
    left_out: list[str] = field(default_factory=list)
    unpaired_checkpoints: list[str] = field(default_factory=list)  # "<unit> (only in the original)"
    differences: list[FileDifference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences


def _left_out(relative: str) -> bool:
    parts = relative.split("/")
    name = parts[-1]
    return (
        name in CONTROL_FILES
        or fsx.is_temporary_name(relative)
        or name.endswith(".log")
        or parts[0] in EXCLUDED_FOLDERS
        or any(_LEFT_BEHIND.search(part) for part in parts[:-1])
    )


def _units(names: set[str]) -> dict[str, tuple[str, set[str]]]:
    """``unit path -> (kind, member names relative to the unit)`` for every compared file."""
    checkpoints = set()
    shards = set()
    for name in names:
        parts = name.split("/")
        for index in range(len(parts) - 1):
            if parts[index].isdigit() and parts[index + 1] == "state":
                checkpoints.add("/".join(parts[: index + 1]))
        if parts[-1] == "shard.json" and name[: -len("shard.json")] + "tokens.bin" in names:
            shards.add(name[: -len("/shard.json")] if "/" in name else "")
    units: dict[str, tuple[str, set[str]]] = {}
    for name in names:
        root = next((c for c in checkpoints if name.startswith(c + "/")), None)
        kind = "checkpoint"
        if root is None:
            folder = name.rpartition("/")[0]
            root, kind = (folder, "token shard") if folder in shards and "/" in name else (name, "file")
        units.setdefault(root, (kind, set()))[1].add(name[len(root) + 1 :] if kind != "file" else name)
    return units


def compare_outputs(placement: Placement, *, stop_at_first: bool = True) -> OutputComparison:
    """Compare the rerun's output folder with the original's (see the module docstring)."""
    original, rerun = placement.original_output, placement.rerun_output
    original_names, rerun_names = set(fsx.find_files(original)), set(fsx.find_files(rerun))
    comparison = OutputComparison()
    compared = set()
    for name in original_names | rerun_names:
        if _left_out(name):
            comparison.left_out.append(name)
        else:
            compared.add(name)
    comparison.left_out.sort()
    normalize = placement.normalizer()
    units = _units(compared)
    newest = _newest_checkpoints(units, original_names, rerun_names)
    for unit, (kind, members) in sorted(units.items(), key=_comparison_order):
        unit_a, unit_b = fsx.join(original, unit), fsx.join(rerun, unit)
        in_a = {m for m in members if (f"{unit}/{m}" if kind != "file" else m) in original_names}
        in_b = {m for m in members if (f"{unit}/{m}" if kind != "file" else m) in rerun_names}
        if not in_a or not in_b:
            side = "original" if in_a else "rerun"
            if kind == "checkpoint" and unit not in newest:
                comparison.unpaired_checkpoints.append(f"{unit} (only in the {side})")
                continue
            what = f"only in the {side}" + (" (its newest checkpoint)" if kind == "checkpoint" else "")
        else:
            what, arrays = _unit_difference(kind, unit, unit_a, unit_b, in_a | in_b, placement, normalize)
            comparison.arrays += arrays
        comparison.files += len(members)
        if what:
            comparison.differences.append(FileDifference(unit, what))
            if stop_at_first:
                break
    return comparison


def _comparison_order(item: tuple[str, tuple[str, set[str]]]) -> tuple[bool, str]:
    """By path, but a token cache's ledger after its shards: it summarises them (their sizes and
    checksums), so a changed record changes it too, and the record is the difference worth naming."""
    unit = item[0]
    return unit.rsplit("/", 1)[-1] == LEDGER_NAME, unit


def _newest_checkpoints(units: dict[str, tuple[str, set[str]]], original: set[str], rerun: set[str]) -> set[str]:
    """The newest checkpoint step of each checkpoints folder, in either run."""
    newest: set[str] = set()
    for names in (original, rerun):
        best: dict[str, tuple[int, str]] = {}
        for unit, (kind, members) in units.items():
            if kind == "checkpoint" and any(f"{unit}/{m}" in names for m in members):
                folder, _, step = unit.rpartition("/")
                best[folder] = max(best.get(folder, (-1, "")), (int(step), unit))
        newest.update(unit for _, unit in best.values())
    return newest


def _unit_difference(kind: str, unit: str, a: str, b: str, members: set[str], placement: Placement, normalize) -> tuple[str | None, int]:
    if kind == "checkpoint":
        return checkpoint_difference(a, b)
    if kind == "token shard":
        return token_shard_difference(a, b, members), 0
    name = unit.rpartition("/")[2]
    if unit == ARTIFACT_FILE:
        return _artifact_difference(placement, normalize), 0
    if name.endswith(".safetensors"):
        return safetensors_difference(a, b)
    if name.endswith(".npz"):
        return npz_difference(a, b)
    if same_bytes(a, b):
        return None, 0
    if _JSONL.search(name):
        return jsonl_difference(a, b, normalize), 0
    if name.endswith(".parquet"):
        return parquet_difference(a, b, normalize), 0
    if name.endswith(".json"):
        return json_difference(a, b, normalize), 0
    return byte_difference(a, b), 0


def _artifact_difference(placement: Placement, normalize) -> str | None:
    a = load_artifact(placement.original_output, prefix=placement.original_prefix)
    b = load_artifact(placement.rerun_output, prefix=placement.rerun_prefix)
    record_a = normalize({"result_type": a.result_type, "result": a.result})
    record_b = normalize({"result_type": b.result_type, "result": b.result})
    return value_difference(record_a, record_b)


__all__ = [
    "CONTROL_FILES",
    "EXCLUDED_FOLDERS",
    "MEASUREMENT_FIELDS",
    "FileDifference",
    "OutputComparison",
    "Placement",
    "compare_outputs",
]
