"""A step's identity: the hash of what it computes, independent of where its output lands.

The identity covers the step's name, version, hash attributes and its dependencies' identities.
It never covers a prefix, an output path, resources, the machine or the working directory, so the
same script gives the same hashes everywhere. Hash attributes must be JSON-like; frozen
dataclasses are accepted and encoded with their class name so two configs of different types
never collide.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from rigging.names import UnsafeNameError, check_relative_name

from marin.errors import MarinError

SHORT_HASH_LENGTH = 8
IDENTITY_FORMAT = 1


class InvalidStepError(MarinError, ValueError):
    """A step definition that cannot be run as written (bad name, unhashable attribute, ...)."""


def validate_step_name(name: str) -> str:
    """Refuse names that could escape the prefix, hide, or not fit a folder (rigging.names' rule)."""
    try:
        return check_relative_name(name, what="Step name", example="tokenized/tinystories")
    except UnsafeNameError as exc:
        raise InvalidStepError(str(exc)) from None


# Values that are their own canonical form, matched by exact type (an int subclass such as IntEnum is not).
_LEAF_TYPES = frozenset({str, int, bool, type(None)})


def canonicalize(value: Any, *, where: str = "hash_attrs", _open: frozenset[int] = frozenset()) -> Any:
    """Turn a hash attribute into plain JSON data, refusing anything whose meaning is ambiguous.

    ``_open`` holds the ids of the containers being canonicalized around ``value``: a container
    that holds itself has no finite JSON form and is refused instead of recursing forever.
    """
    kind = type(value)
    if kind in _LEAF_TYPES:
        return value  # the common leaves, by exact type: what the checks below would answer, sooner
    if kind is dict:
        if not value:
            return {}
        if id(value) in _open:
            raise InvalidStepError(f"{where} refers back to a value that contains it; hash attributes must be a tree.")
        return _canonical_items(value, where, _open | {id(value)})
    if isinstance(value, (Mapping, list, tuple)) or dataclasses.is_dataclass(value):
        if id(value) in _open:
            raise InvalidStepError(f"{where} refers back to a value that contains it; hash attributes must be a tree.")
        _open = _open | {id(value)}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidStepError(f"{where} is {value!r}; hash attributes must be finite numbers.")
        # Integral floats hash like ints would not; keep the type so 1 and 1.0 stay distinct.
        return value
    if hasattr(value, "identity") and hasattr(value, "deps"):
        raise InvalidStepError(
            f"{where} holds the step {getattr(value, 'name', value)!r}; pass steps in deps= "
            "(their identities are hashed from there) and refer to them by name in hash_attrs."
        )
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        params = getattr(type(value), "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise InvalidStepError(
                f"{where} is an instance of the mutable dataclass {type(value).__qualname__}; "
                "declare it with @dataclass(frozen=True) so it cannot change after hashing."
            )
        fields = {
            f.name: canonicalize(getattr(value, f.name), where=f"{where}.{f.name}", _open=_open)
            for f in dataclasses.fields(value)
            if not _omitted_default(value, f)
        }
        return {"__class__": type(value).__qualname__, **fields}
    if isinstance(value, Mapping):
        return _canonical_items(value, where, _open)
    if isinstance(value, (list, tuple)):
        return [canonicalize(item, where=f"{where}[{i}]", _open=_open) for i, item in enumerate(value)]
    raise InvalidStepError(
        f"{where} has a value of type {type(value).__name__} ({value!r:.80}); hash attributes must be "
        "JSON-like (dict, list, str, number, bool, None) or frozen dataclasses. Convert it, e.g. str(path)."
    )


def canonical_hash_attrs(attrs: Mapping[str, Any], *, step_name: str) -> dict[str, Any]:
    """What :func:`canonicalize` makes of a step's hash attributes, in a new dict (sooner for the
    common flat dict of strings, ints, bools and Nones, which is its own canonical form)."""
    if type(attrs) is dict:
        for key, value in attrs.items():
            if type(key) is not str or type(value) not in _LEAF_TYPES:
                break
        else:
            return dict(attrs)
    return canonicalize(attrs, where=f"{step_name}.hash_attrs")


def _canonical_items(value: Mapping, where: str, _open: frozenset[int]) -> dict[str, Any]:
    result = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidStepError(f"{where} has the key {key!r}; hash attribute keys must be strings.")
        if type(item) in _LEAF_TYPES:
            result[key] = item  # as canonicalize would answer, without building the path to name it by
        else:
            result[key] = canonicalize(item, where=f"{where}.{key}", _open=_open)
    return result


def _omitted_default(value: Any, f: dataclasses.Field) -> bool:
    """A field whose metadata says ``omit_when_default`` is left out while it holds its default:
    configs mark options added after they were first hashed, so adding one keeps existing identities."""
    return bool(f.metadata.get("omit_when_default")) and f.default is not dataclasses.MISSING and getattr(value, f.name) == f.default


_CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# The C encoder that ``JSONEncoder.encode`` would build on every call, built once (a sweep hashes
# thousands of steps). No circular-reference markers: :func:`canonicalize` already refuses cycles.
_C_ENCODER = (
    json.encoder.c_make_encoder(None, None, json.encoder.c_encode_basestring, None, ":", ",", True, False, False)
    if json.encoder.c_make_encoder is not None and json.encoder.c_encode_basestring is not None
    else None
)


def canonical_json(value: Any) -> str:
    """``value`` as compact JSON with sorted keys, non-ASCII kept, NaN and infinities refused."""
    if _C_ENCODER is None:  # a Python without the C accelerator
        return _CANONICAL_ENCODER.encode(value)
    return "".join(_C_ENCODER(value, 0))


def identity_record(
    name: str, version: str | None, hash_attrs: Any, dep_identities: Iterable[str], *, canonical: bool = False
) -> dict[str, Any]:
    """Exactly what is hashed; stored in ``.executor_info`` so ``marin explain`` can show it.

    :func:`step_identity` hashes the same record without building it: a key added here must be
    spelled out there too (``test_a_step_hashes_exactly_the_record_it_stores`` holds them equal).

    ``canonical``: ``hash_attrs`` is already what :func:`canonicalize` made of them (a step keeps
    that from its declaration), so it is not walked again.
    """
    return {
        "format": IDENTITY_FORMAT,
        "name": name,
        "version": version,
        "hash_attrs": hash_attrs if canonical else canonicalize(hash_attrs),
        # Sorted: dependency order in a list is not part of what a step computes.
        "deps": sorted(dep_identities),
    }


def identity_hash(record: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(record).encode("utf-8")).hexdigest()


_JSON_STRING = json.encoder.encode_basestring  # a JSON string literal, non-ASCII kept (ensure_ascii off)


def step_identity(name: str, version: str | None, canonical_hash_attrs: Any, dep_identities: Iterable[str]) -> str:
    """``identity_hash(identity_record(...))`` for hash attributes already canonical, without
    building the record: its keys are fixed, so its canonical JSON is spelled out here in their
    sorted order (a sweep hashes thousands of steps; the test suite holds the two to one answer)."""
    deps = ",".join([f'"{identity}"' for identity in sorted(dep_identities)])  # hex digests: no escapes
    attrs = canonical_json(canonical_hash_attrs) if canonical_hash_attrs else "{}"
    version_json = "null" if version is None else _JSON_STRING(version)
    text = f'{{"deps":[{deps}],"format":{IDENTITY_FORMAT},"hash_attrs":{attrs},"name":{_JSON_STRING(name)},"version":{version_json}}}'
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def short_hash(identity: str) -> str:
    return identity[:SHORT_HASH_LENGTH]
