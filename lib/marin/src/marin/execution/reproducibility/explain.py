"""Why a step has the hash it has, and what differs between two hashes (``marin explain``).

Everything here reads the ``identity_record`` that the runner stored in each ``.executor_info``:
exactly the data that was hashed. Dependencies are followed through the locations recorded
there (resolved against the prefix as it is now, so a moved prefix still explains), so the tree
is what actually ran, not what a script would compute today. A damaged ``.executor_info`` raises
:class:`~marin.execution.records.executor_files.CorruptRecordError` naming the file.
"""

from __future__ import annotations

import json
from typing import Any

from rigging.regular_files import stays_within

from marin.execution.records.executor_files import read_info, recorded_dependency_paths

MAX_DEPTH = 32
# The annotation naming hash attributes that are null because a dependency provides the value (a
# tokenizer built by a step): ``{"tokenize.tokenizer": "tokenizers/builtin-bpe"}``.
PROVIDED_BY_DEPENDENCY = "provided_by_dependency"


def flatten_attributes(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists keep their positions (``a[0]``)."""
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key in sorted(value):
            flat.update(flatten_attributes(value[key], f"{prefix}.{key}" if prefix else key))
        return flat
    if isinstance(value, list) and value:
        flat = {}
        for index, item in enumerate(value):
            flat.update(flatten_attributes(item, f"{prefix}[{index}]"))
        return flat
    return {prefix or "(value)": value}


def identity_settings(info: dict[str, Any]) -> dict[str, Any]:
    """What went into a step's identity, one entry per setting, as ``marin explain A B`` compares
    them: ``version``, each flattened hash attribute (``hash_attrs.optimizer.learning_rate``) and each
    dependency's identity (``dependency tokenized/x``, its first 8 hex digits)."""
    settings: dict[str, Any] = {"version": info.get("version")}
    settings.update({f"hash_attrs.{k}": v for k, v in flatten_attributes(info.get("hash_attrs") or {}).items()})
    for dep in info.get("deps") or []:
        if isinstance(dep, dict) and dep.get("name"):
            settings[f"dependency {dep['name']}"] = str(dep.get("identity") or "")[:8]
    return settings


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 100 else text[:97] + "..."


def identity_record_tree(output_path: str, *, depth: int = 0) -> dict[str, Any]:
    """The step at ``output_path`` as data (``marin explain --json``): its name, identity, version,
    function, hashed attributes, and each dependency's tree under ``deps``."""
    info = read_info(output_path, strict=True)
    if info is None:
        return {"output_path": output_path, "error": "no .executor_info"}
    deps = []
    for dep, dep_path in recorded_dependency_paths(output_path, info):
        if depth >= MAX_DEPTH or not dep_path:
            deps.append({"name": dep.get("name"), "identity": dep.get("identity"), "output_path": dep_path})
        else:
            deps.append(identity_record_tree(dep_path, depth=depth + 1))
    return {
        "name": info.get("name"),
        "identity": info.get("identity"),
        "version": info.get("version"),
        "output_path": output_path,
        "fn": info.get("fn"),
        "hash_attrs": info.get("hash_attrs") or {},
        "deps": deps,
    }


def identity_tree(output_path: str, *, indent: int = 0, depth: int = 0) -> list[str]:
    """Lines showing the step at ``output_path``, its hashed attributes, and its dependencies' trees."""
    pad = "  " * indent
    info = read_info(output_path, strict=True)
    if info is None:
        return [f"{pad}(no .executor_info at {output_path})"]
    lines = [f"{pad}{info.get('name')}  {str(info.get('identity'))[:8]}  version={info.get('version')!r}  {output_path}"]
    lines.append(f"{pad}  fn: {info.get('fn')}")
    attrs = flatten_attributes(info.get("hash_attrs") or {})
    if attrs and attrs != {"(value)": {}}:
        provided = (info.get("annotations") or {}).get(PROVIDED_BY_DEPENDENCY) or {}
        lines.append(f"{pad}  hash_attrs:")
        lines.extend(f"{pad}    {key} = {_short(value)}"
                     + (f"  (the dependency {provided[key]}, below)" if value is None and key in provided else "")
                     for key, value in attrs.items())
    for dep, dep_path in recorded_dependency_paths(output_path, info):
        lines.append(f"{pad}  dep {dep.get('name')} ({str(dep.get('identity'))[:8]}):")
        if depth >= MAX_DEPTH:
            lines.append(f"{pad}    ...")
        elif dep_path:
            lines.extend(identity_tree(dep_path, indent=indent + 2, depth=depth + 1))
        else:
            lines.append(f"{pad}    (no recorded output path)")
    return lines


def identity_differences(path_a: str, path_b: str, *, depth: int = 0, where: str = "",
                         within: str | None = None) -> list[str]:
    """Human-readable differences between two steps' identities, following changed dependencies.

    ``within``: a folder every record read must lie in once links are followed (the web view's
    prefix); a changed dependency outside it is reported by its identity, not followed.
    """
    info_a, info_b = read_info(path_a, strict=True, within=within), read_info(path_b, strict=True, within=within)
    if info_a is None or info_b is None:
        missing = path_a if info_a is None else path_b
        return [f"{where or 'step'}: no .executor_info at {missing}"]
    label = where or str(info_a.get("name"))
    if info_a.get("identity") == info_b.get("identity"):
        return []
    differences = []
    for key in ("name", "version"):
        if info_a.get(key) != info_b.get(key):
            differences.append(f"{label}: {key} changed {info_a.get(key)!r} -> {info_b.get(key)!r}")
    attrs_a, attrs_b = flatten_attributes(info_a.get("hash_attrs") or {}), flatten_attributes(info_b.get("hash_attrs") or {})
    for key in sorted(set(attrs_a) | set(attrs_b)):
        if key not in attrs_b:
            differences.append(f"{label}: hash_attrs.{key} removed (was {_short(attrs_a[key])})")
        elif key not in attrs_a:
            differences.append(f"{label}: hash_attrs.{key} added ({_short(attrs_b[key])})")
        elif attrs_a[key] != attrs_b[key]:
            differences.append(f"{label}: hash_attrs.{key} changed {_short(attrs_a[key])} -> {_short(attrs_b[key])}")
    deps_a = {d.get("name"): {**d, "output_path": p} for d, p in recorded_dependency_paths(path_a, info_a)}
    deps_b = {d.get("name"): {**d, "output_path": p} for d, p in recorded_dependency_paths(path_b, info_b)}
    for name in sorted(set(deps_a) | set(deps_b), key=str):
        if name not in deps_b:
            differences.append(f"{label}: dependency {name} removed")
        elif name not in deps_a:
            differences.append(f"{label}: dependency {name} added")
        elif deps_a[name].get("identity") != deps_b[name].get("identity"):
            a, b = deps_a[name], deps_b[name]
            header = f"{label} -> {name}"
            followed = [a.get("output_path"), b.get("output_path")]
            if depth < MAX_DEPTH and all(followed) and (within is None or all(stays_within(within, p) for p in followed)):
                nested = identity_differences(*followed, depth=depth + 1, where=header, within=within)
            else:
                nested = []
            differences.extend(nested or [f"{header}: identity changed {str(a.get('identity'))[:8]} -> {str(b.get('identity'))[:8]}"])
    if not differences:
        differences.append(f"{label}: identities differ but the recorded inputs look the same (was the hashing format changed?)")
    return differences
