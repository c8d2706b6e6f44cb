"""A step's typed result, saved as ``.artifact.json`` next to its output, with provenance.

Downstream steps learn an upstream step's result and output location from this record (via
``ctx.load_artifact(dep)``) instead of re-deriving paths. A result is a dataclass or JSON-like
data (dict with string keys, list, tuple, str, number, bool, None); dataclasses may nest. The
file looks like::

    {
      "format": 1,
      "result_type": "mypkg.results:TokenizedResult",   # null for plain JSON results
      "result": {"splits": {"train": {"cache_path": "train", ...}}, ...},
      "relative_paths": [[["splits", "train", "cache_path"], "output"]],
      "output_path": "/abs/prefix/tokenized/tinystories-1a2b3c4d",   # where it was written
      "prefix": "/abs/prefix",
      "provenance": {"step": ..., "identity": ..., "git_commit": ..., "git_dirty": ...,
                     "user": ..., "host": ..., "argv": [...], "time": "2026-...Z"}
    }

**Moving and copying.** A result that names files of its own output, or of other steps' outputs
under the same prefix, is stored with those paths made relative (to the step's folder or to the
prefix) and listed in ``relative_paths``; :func:`load_artifact` joins them to where the folder is
*now*. So a prefix that was moved still works, and a copied one reads its own files, never the
original's.

**Result types.** ``result_type`` is a record, not an instruction: reading an artifact never
imports a module it names. A result is rebuilt as a class only when the caller passes one, or,
for printing summaries, when the class was registered in this process (by
:func:`register_result_type`, or by saving a result of that type).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import getpass
import json
import math
import os
import socket
import subprocess
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from rigging import filesystem as fsx
from rigging.secrets import redact_argv

from marin.errors import MarinError
from marin.execution.records.executor_files import ARTIFACT_FILE

ARTIFACT_FORMAT = 1
T = TypeVar("T")

# Bases that relative paths in a result are resolved against.
RELATIVE_TO_OUTPUT = "output"
RELATIVE_TO_PREFIX = "prefix"

_RESULT_TYPES: dict[str, type] = {}


class ArtifactError(MarinError, ValueError):
    """A result that cannot be saved as JSON, or a record that cannot be read back as asked."""


@dataclass(frozen=True)
class Provenance:
    """Who made an artifact, from what code, when."""

    step: str | None = None
    identity: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    user: str | None = None
    host: str | None = None
    argv: tuple[str, ...] = ()
    time: str | None = None


@dataclass(frozen=True)
class Artifact:
    """A loaded ``.artifact.json``: the result, where the output lives, and how it was made."""

    result: Any
    output_path: str
    provenance: Provenance
    result_type: str | None = None


@functools.lru_cache(maxsize=8)
def _git_state(cwd: str) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the repository holding ``cwd``; (None, None) outside git. Cached per run."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        )
        return commit or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


@functools.lru_cache(maxsize=1)
def _login_name() -> str | None:
    """Who runs this process; looked up once (without ``USER`` set, a read of the password database)."""
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return None


def current_provenance(*, step: str | None = None, identity: str | None = None) -> Provenance:
    commit, dirty = _git_state(os.getcwd())
    return Provenance(
        step=step,
        identity=identity,
        git_commit=commit,
        git_dirty=dirty,
        user=_login_name(),
        host=socket.gethostname(),
        argv=redact_argv(sys.argv),  # `--set wandb.key=...` must not be kept beside the output
        time=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    )


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_result_type(cls: type[T]) -> type[T]:
    """Allow artifacts that name ``cls`` to be rebuilt as it for their ``summary()`` (a class decorator)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ArtifactError(f"Only dataclasses can be result types, got {cls!r}.")
    _RESULT_TYPES[_type_name(cls)] = cls
    return cls


def registered_result_type(name: str | None) -> type | None:
    """The registered class named ``name`` (``module:qualname``), or ``None``; never imports anything."""
    return _RESULT_TYPES.get(name) if name else None


def encode_result(value: Any, *, where: str = "result") -> Any:
    """Plain JSON data for ``value``; raises :class:`ArtifactError` for anything else."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArtifactError(f"{where} is {value!r}; results must hold finite numbers (JSON has no NaN).")
        return value
    if isinstance(value, enum.Enum):
        return encode_result(value.value, where=where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode_result(getattr(value, f.name), where=f"{where}.{f.name}") for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ArtifactError(f"{where} has the key {key!r}; result dict keys must be strings.")
            encoded[key] = encode_result(item, where=f"{where}.{key}")
        return encoded
    if isinstance(value, (list, tuple)):
        return [encode_result(item, where=f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise ArtifactError(
        f"{where} has a value of type {type(value).__name__}; a step's result must be a dataclass or JSON-like "
        "(dict, list, str, number, bool, None). Write large data to the output path and return its location."
    )


def decode_result(data: Any, cls: Any) -> Any:
    """Rebuild ``cls`` (a dataclass, a typed container, or a plain type) from JSON data."""
    if cls is None or cls is Any or data is None:
        return data
    origin = typing.get_origin(cls)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(cls) if arg is not type(None)]
        for option in options:
            try:
                return decode_result(data, option)
            except (ArtifactError, TypeError, ValueError):
                continue
        return data
    if origin in (list, tuple, set, frozenset) or cls in (list, tuple, set, frozenset):
        args = typing.get_args(cls)
        container = origin or cls
        if container is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],)
        if container is tuple and len(args) > 1:
            return tuple(decode_result(item, arg) for item, arg in zip(data, args))
        item_type = args[0] if args else None
        return container(decode_result(item, item_type) for item in data)
    if origin is dict or cls is dict:
        args = typing.get_args(cls)
        value_type = args[1] if len(args) == 2 else None
        return {key: decode_result(item, value_type) for key, item in data.items()}
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return cls(data)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise ArtifactError(f"Cannot build {cls.__qualname__} from {type(data).__name__}; expected a JSON object.")
        hints = typing.get_type_hints(cls)
        known = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ArtifactError(f"The saved result has fields {unknown} that {cls.__qualname__} does not define.")
        return cls(**{name: decode_result(value, hints.get(name)) for name, value in data.items()})
    return data


def _relativize(value: Any, bases: list[tuple[str, str]], where: list[Any], found: list[list[Any]]) -> Any:
    """``value`` with each string under one of ``bases`` (``(kind, root)``) made relative to it."""
    if isinstance(value, str):
        for kind, root in bases:
            if value == root:
                found.append([list(where), kind])
                return "."
            if value.startswith(root + "/"):
                found.append([list(where), kind])
                return value[len(root) + 1 :]
        return value
    if isinstance(value, dict):
        return {key: _relativize(item, bases, [*where, key], found) for key, item in value.items()}
    if isinstance(value, list):
        return [_relativize(item, bases, [*where, i], found) for i, item in enumerate(value)]
    return value


def save_artifact(
    output_path: str,
    result: Any,
    *,
    step: str | None = None,
    identity: str | None = None,
    provenance: Provenance | None = None,
    prefix: str | None = None,
    staged_in: str | None = None,
) -> Artifact:
    """Write ``result`` (and provenance) to ``<output_path>/.artifact.json`` atomically.

    Paths inside ``output_path`` (and, given ``prefix``, inside the prefix) are stored relative;
    see the module docstring. ``staged_in`` is the folder the step's execution wrote its output
    into, to be moved into ``output_path`` when it is committed (:mod:`marin.execution.ownership.step_ownership`):
    the file goes there, and the result's paths into it are stored relative to it.
    """
    encoded = encode_result(result)
    provenance = provenance or current_provenance(step=step, identity=identity)
    result_type = _type_name(type(result)) if dataclasses.is_dataclass(result) else None
    if result_type is not None:
        # A type this process returned as a result is declared by the step that returned it.
        _RESULT_TYPES.setdefault(result_type, type(result))
    # The step's own folder first: it lies inside the prefix too, and is the nearer base.
    bases = [(RELATIVE_TO_OUTPUT, (staged_in or output_path).rstrip("/"))]
    if staged_in is not None:
        bases.append((RELATIVE_TO_OUTPUT, output_path.rstrip("/")))
    if prefix:
        bases.append((RELATIVE_TO_PREFIX, prefix.rstrip("/")))
    relative_paths: list[list[Any]] = []
    stored = _relativize(encoded, bases, [], relative_paths)
    record = {
        "format": ARTIFACT_FORMAT,
        "result_type": result_type,
        "result": stored,
        "relative_paths": relative_paths,
        "output_path": output_path,
        "prefix": prefix,
        # Plain values: a shallow copy (asdict deep-copies each one).
        "provenance": {**{f.name: getattr(provenance, f.name) for f in dataclasses.fields(provenance)},
                       "argv": list(provenance.argv)},
    }
    fsx.atomic_write(fsx.join(staged_in or output_path, ARTIFACT_FILE), json.dumps(record, indent=2, sort_keys=True, allow_nan=False))
    return Artifact(result=result, output_path=output_path, provenance=provenance, result_type=result_type)


def _prefix_now(output_path: str, record: dict[str, Any]) -> str | None:
    """Where the prefix the artifact was written under lies now: the step's folder keeps its place in it."""
    written_at, written_prefix = record.get("output_path"), record.get("prefix")
    if not (isinstance(written_at, str) and isinstance(written_prefix, str)):
        return None
    root = written_prefix.rstrip("/")
    if not written_at.startswith(root + "/"):
        return written_prefix  # written outside its prefix (an explicit path): the prefix did not move with it
    location = written_at[len(root) + 1 :].rstrip("/")
    here = output_path.rstrip("/")
    return here[: -len(location) - 1] if here.endswith("/" + location) else written_prefix


def _resolve_relative_paths(result: Any, record: dict[str, Any], output_path: str, prefix: str | None, url: str) -> Any:
    entries = record.get("relative_paths") or []
    if not entries:
        return result
    prefix = prefix or _prefix_now(output_path, record)
    bases = {RELATIVE_TO_OUTPUT: output_path.rstrip("/"), RELATIVE_TO_PREFIX: prefix.rstrip("/") if prefix else None}
    root = [result]  # so that a result which is itself a path has a container too
    for entry in entries:
        try:
            where, kind = entry
            *parents, last = [0, *where]
            container = root
            for key in parents:
                container = container[key]
            relative = container[last]
            base = bases[kind]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ArtifactError(
                f"{url} lists a relative path {entry!r} that its result does not hold; the file was edited or is "
                "damaged. Delete the step's folder and run it again."
            ) from None
        if base is None or not isinstance(relative, str):
            raise ArtifactError(f"{url}: cannot resolve the relative path {relative!r} ({kind}); the prefix is unknown.")
        container[last] = base if relative == "." else fsx.join(base, relative)
    return root[0]


def load_artifact(output_path: str, cls: type[T] | Any = None, *, prefix: str | None = None) -> Artifact:
    """Read ``<output_path>/.artifact.json``; with ``cls``, the result is rebuilt as that type.

    Without ``cls`` the result is the stored JSON data (dataclasses come back as dicts); the
    stored ``result_type`` names the class that was saved. Relative paths are resolved against
    ``output_path`` as given and ``prefix`` (default: the prefix ``output_path`` lies under now).
    """
    url = fsx.join(output_path, ARTIFACT_FILE)
    text = fsx.read_text(url)
    if text is None:
        raise ArtifactError(
            f"No artifact at {url}. The step has not finished successfully there; run it first (marin status shows its state)."
        )
    try:
        record = json.loads(text)
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, found {type(record).__name__}")
    except ValueError as exc:
        raise ArtifactError(
            f"{url} is corrupt ({exc}), so the result of that step cannot be read. Delete the step's folder "
            f"({output_path}) and run again to recompute it."
        ) from exc
    raw_provenance = record.get("provenance") or {}
    known = {f.name for f in dataclasses.fields(Provenance)}
    provenance = Provenance(**{k: v for k, v in raw_provenance.items() if k in known})
    provenance = dataclasses.replace(provenance, argv=tuple(provenance.argv or ()))
    data = _resolve_relative_paths(record.get("result"), record, output_path, prefix, url)
    result = decode_result(data, cls) if cls is not None else data
    return Artifact(
        result=result,
        output_path=output_path,
        provenance=provenance,
        result_type=record.get("result_type"),
    )


def result_summary(output_path: str) -> str | None:
    """The saved result's own ``summary()`` text, when its type is registered and defines one.

    Result types opt in by defining ``summary(self) -> str``; the runner prints it for the final
    steps of a run, whether they ran now or were cached.
    """
    try:
        artifact = load_artifact(output_path)
    except ArtifactError:
        return None
    cls = registered_result_type(artifact.result_type)
    if cls is None or not callable(getattr(cls, "summary", None)):
        return None
    try:
        return decode_result(artifact.result, cls).summary()
    except (ArtifactError, TypeError, ValueError):
        return None
