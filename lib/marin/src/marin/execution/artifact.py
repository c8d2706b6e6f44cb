"""A step's typed result, saved as ``.artifact.json`` next to its output, with provenance.

Downstream steps learn an upstream step's result and output location from this record (via
``ctx.load_artifact(dep)``) instead of re-deriving paths. A result is a dataclass or JSON-like
data (dict with string keys, list, tuple, str, number, bool, None); dataclasses may nest. The
file looks like::

    {
      "format": 1,
      "result_type": "mypkg.results:TokenizedResult",   # null for plain JSON results
      "result": {...},
      "output_path": "/abs/prefix/tokenized/tinystories-1a2b3c4d",
      "provenance": {"step": ..., "identity": ..., "git_commit": ..., "git_dirty": ...,
                     "user": ..., "host": ..., "argv": [...], "time": "2026-...Z"}
    }
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

from marin.execution.executor_files import ARTIFACT_FILE

ARTIFACT_FORMAT = 1
T = TypeVar("T")


class ArtifactError(ValueError):
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


def current_provenance(*, step: str | None = None, identity: str | None = None) -> Provenance:
    commit, dirty = _git_state(os.getcwd())
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = None
    return Provenance(
        step=step,
        identity=identity,
        git_commit=commit,
        git_dirty=dirty,
        user=user,
        host=socket.gethostname(),
        argv=tuple(sys.argv),
        time=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    )


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


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


def save_artifact(
    output_path: str,
    result: Any,
    *,
    step: str | None = None,
    identity: str | None = None,
    provenance: Provenance | None = None,
) -> Artifact:
    """Write ``result`` (and provenance) to ``<output_path>/.artifact.json`` atomically."""
    encoded = encode_result(result)
    provenance = provenance or current_provenance(step=step, identity=identity)
    result_type = _type_name(type(result)) if dataclasses.is_dataclass(result) else None
    record = {
        "format": ARTIFACT_FORMAT,
        "result_type": result_type,
        "result": encoded,
        "output_path": output_path,
        "provenance": {**dataclasses.asdict(provenance), "argv": list(provenance.argv)},
    }
    fsx.atomic_write(fsx.join(output_path, ARTIFACT_FILE), json.dumps(record, indent=2, sort_keys=True, allow_nan=False))
    return Artifact(result=result, output_path=output_path, provenance=provenance, result_type=result_type)


def load_artifact(output_path: str, cls: type[T] | Any = None) -> Artifact:
    """Read ``<output_path>/.artifact.json``; with ``cls``, the result is rebuilt as that type.

    Without ``cls`` the result is the stored JSON data (dataclasses come back as dicts); the
    stored ``result_type`` names the class that was saved.
    """
    url = fsx.join(output_path, ARTIFACT_FILE)
    text = fsx.read_text(url)
    if text is None:
        raise ArtifactError(
            f"No artifact at {url}. The step has not finished successfully there; run it first (marin status shows its state)."
        )
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise ArtifactError(f"{url} is not valid JSON: {exc}") from exc
    raw_provenance = record.get("provenance") or {}
    known = {f.name for f in dataclasses.fields(Provenance)}
    provenance = Provenance(**{k: v for k, v in raw_provenance.items() if k in known})
    provenance = dataclasses.replace(provenance, argv=tuple(provenance.argv or ()))
    result = decode_result(record.get("result"), cls) if cls is not None else record.get("result")
    return Artifact(
        result=result,
        output_path=record.get("output_path", output_path),
        provenance=provenance,
        result_type=record.get("result_type"),
    )


def result_summary(output_path: str) -> str | None:
    """The saved result's own ``summary()`` text, when its type defines one and can be imported.

    Result types opt in by defining ``summary(self) -> str``; the runner prints it for the final
    steps of a run, whether they ran now or were cached.
    """
    try:
        artifact = load_artifact(output_path)
    except ArtifactError:
        return None
    if not artifact.result_type or ":" not in artifact.result_type:
        return None
    module_name, _, qualname = artifact.result_type.partition(":")
    try:
        import importlib

        cls: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        return None
    if not callable(getattr(cls, "summary", None)):
        return None
    try:
        return decode_result(artifact.result, cls).summary()
    except (ArtifactError, TypeError, ValueError):
        return None
