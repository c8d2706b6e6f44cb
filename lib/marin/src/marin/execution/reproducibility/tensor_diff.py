"""The first difference between two sets of named arrays: checkpoints, safetensors, ``.npz`` files.

Arrays are compared bit for bit (a NaN equals a NaN with the same bits; ``0.0`` and ``-0.0``
differ), a group of at most :data:`GROUP_BYTES` from each side at a time, so two checkpoints of a
large model are never both in memory. Orbax
checkpoints are compared by their arrays, never their bytes: Orbax names its data files at random
and stamps its metadata with times, so two identical states never have identical files. Model
parameters are compared first (the arrays a reader cares about most), then the rest by name.

A difference names the first differing array, its largest absolute difference and where, and how
many of the arrays differ.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping

import numpy as np
from rigging import filesystem as fsx

from marin.execution.reproducibility.record_diff import byte_difference, same_bytes

# How many bytes of arrays are read from each side at once: few reads for small checkpoints,
# bounded memory for large ones.
GROUP_BYTES = 256 << 20


def _order(names: set[str]) -> list[str]:
    return sorted(names, key=lambda name: (not name.startswith("params"), name))


def array_difference(original: np.ndarray, rerun: np.ndarray) -> str | None:
    """How two arrays differ (shape, dtype, or values bit for bit), or ``None``."""
    if original.shape != rerun.shape or original.dtype != rerun.dtype:
        return f"stored {original.shape} {original.dtype} in the original, {rerun.shape} {rerun.dtype} in the rerun"
    a, b = np.ascontiguousarray(original), np.ascontiguousarray(rerun)
    if a.tobytes() == b.tobytes():
        return None
    bits = np.dtype(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else None
    differing = a.view(bits) != b.view(bits) if bits is not None else a != b
    count = int(np.count_nonzero(differing))
    try:
        gap = np.abs(a.astype(np.float64) - b.astype(np.float64))
        gap = np.where(differing, np.nan_to_num(gap, nan=np.inf), 0.0)
        where = np.unravel_index(int(np.argmax(gap)), a.shape) if a.shape else ()
        largest = float(gap[where]) if a.shape else float(gap)
        size = f"largest absolute difference {largest:.6g}"
        if a.shape:
            size += f" at index {tuple(int(i) for i in where)} ({a[where].item()!r} in the original, {b[where].item()!r} in the rerun)"
        else:
            size += f" ({a.item()!r} in the original, {b.item()!r} in the rerun)"
    except (TypeError, ValueError):  # not numbers (strings, objects): the count says enough
        size = "values differ"
    return f"{size}; {count:,} of {a.size:,} elements differ"


def _groups(names: list[str], specs: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> Iterator[list[str]]:
    """``names`` in order, in groups of at most :data:`GROUP_BYTES` (an array larger than that alone)."""
    group: list[str] = []
    size = 0
    for name in names:
        shape, dtype = specs[name]
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if group and size + nbytes > GROUP_BYTES:
            yield group
            group, size = [], 0
        group.append(name)
        size += nbytes
    if group:
        yield group


def named_arrays_difference(
    original: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    rerun: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    read_original: Callable[[list[str]], Mapping[str, np.ndarray]],
    read_rerun: Callable[[list[str]], Mapping[str, np.ndarray]],
) -> tuple[str | None, int]:
    """``(the first difference, arrays compared)`` of two sets of named arrays, given their shapes and
    dtypes (``name -> (shape, dtype)``) and a reader for each (names -> arrays), which is asked for
    groups of arrays small enough to hold from both sides at once."""
    only = sorted(set(original) ^ set(rerun))
    if only:
        side = "original" if only[0] in original else "rerun"
        return f"array {only[0]} is only in the {side} ({len(only)} array(s) are in one of them only)", 0
    for name in _order(set(original)):
        shape_a, dtype_a = original[name]
        shape_b, dtype_b = rerun[name]
        if tuple(shape_a) != tuple(shape_b) or np.dtype(dtype_a) != np.dtype(dtype_b):
            return f"array {name}: stored {tuple(shape_a)} {dtype_a} in the original, {tuple(shape_b)} {dtype_b} in the rerun", 0
    first, differing = None, []
    names = _order(set(original))
    for group in _groups(names, original):
        group_a, group_b = read_original(group), read_rerun(group)
        for name in group:
            found = array_difference(group_a[name], group_b[name])
            if found:
                differing.append(name)
                first = first or f"tensor {name} differs: {found}"
    if first is None:
        return None, len(names)
    return f"{first} ({len(differing)} of {len(names)} arrays differ)", len(names)


def _specs(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {name: (tuple(array.shape), array.dtype) for name, array in arrays.items()}


def _in_memory_difference(original: Mapping[str, np.ndarray], rerun: Mapping[str, np.ndarray]) -> tuple[str | None, int]:
    return named_arrays_difference(_specs(original), _specs(rerun), lambda _: original, lambda _: rerun)


def _read_bytes(url: str) -> bytes:
    with fsx.open_url(url, "rb") as handle:
        return handle.read()


def safetensors_difference(original: str, rerun: str) -> tuple[str | None, int]:
    """Two ``.safetensors`` files: equal bytes, or the first differing tensor."""
    if same_bytes(original, rerun):
        return None, 0
    from safetensors.numpy import load

    try:
        arrays = load(_read_bytes(original)), load(_read_bytes(rerun))
    except Exception:  # noqa: BLE001 - a dtype NumPy lacks (bfloat16) or a damaged header: say where the bytes part
        return byte_difference(original, rerun), 0
    return _in_memory_difference(*arrays)


def npz_difference(original: str, rerun: str) -> tuple[str | None, int]:
    """Two ``.npz`` files (zip archives that stamp a time in each entry): the first differing array."""
    if same_bytes(original, rerun):
        return None, 0
    with np.load(io.BytesIO(_read_bytes(original)), allow_pickle=False) as a, np.load(io.BytesIO(_read_bytes(rerun)), allow_pickle=False) as b:
        return _in_memory_difference({k: a[k] for k in a.files}, {k: b[k] for k in b.files})


def checkpoint_difference(original: str, rerun: str) -> tuple[str | None, int]:
    """Two Orbax checkpoint step folders (``<checkpoints>/<step>``), compared array by array."""
    from levanter.trainer.checkpoint_arrays import open_checkpoint_arrays

    with open_checkpoint_arrays(original) as a, open_checkpoint_arrays(rerun) as b:
        return named_arrays_difference(
            {name: (s.shape, s.dtype) for name, s in a.stored.items()},
            {name: (s.shape, s.dtype) for name, s in b.stored.items()},
            a.read,
            b.read,
        )


__all__ = ["array_difference", "checkpoint_difference", "named_arrays_difference", "npz_difference", "safetensors_difference"]
