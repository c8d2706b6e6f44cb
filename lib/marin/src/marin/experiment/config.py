"""Settings for experiment scripts: frozen dataclasses read from YAML files and ``a.b.c=value``
overrides, every value checked against its field's type.

A sweep is then a loop over override strings::

    for lr in (1e-3, 3e-3):
        run(apply_overrides(base, [f"optimizer.learning_rate={lr}"]))

Nothing here hashes anything: an override returns a new config, and the steps built from it hash
its fields as usual, so only the values that changed move a step's identity.

Values are parsed as YAML (``3``, ``0.01``, ``true``, ``null``, ``[a, b]``, ``{x: 1}``) and then
converted to the field's type: ``int``, ``float`` (an int or ``1e-3`` is accepted), ``bool``,
``str`` (the text as written), ``Optional``/unions, enums (by value or name), ``Literal``,
tuples, lists, dicts and nested dataclasses (from a mapping). A field whose type is a family of
configs with a registry (``OptimizerConfig``: a base with ``registered()``, each member naming
itself by ``type_name``) takes a ``type:`` key choosing the member (``optimizer: {type: muon,
learning_rate: 0.02}``; ``--set optimizer.type=lion`` switches the member and keeps the fields they
share), and :func:`dump_config` writes that key. An unknown key is refused naming the
closest field names; a value of the wrong type is refused naming the field and its type, and so is
a value a nested config's own check refuses (``optimizer.learning_rate=-1``).

Config files and override values are read strictly, by :mod:`rigging.config.settings_file`: a key
given twice in one mapping is refused (YAML would keep the last one silently), naming the key and
both lines; aliases (``&anchor`` / ``*anchor``) are allowed but the document they expand to is
bounded (:data:`MAX_CONFIG_VALUES`), so a few hundred bytes of nested aliases cannot grow into
gigabytes when the settings are hashed or printed; a file larger than :data:`MAX_CONFIG_BYTES`, a
path that is no regular file (a directory, a FIFO, a link to nothing) and bytes that are not UTF-8
are refused before anything is parsed; an integer too long to print and a value YAML cannot build
(``2024-13-45``) are refused naming the line. Every refusal is one line.

:func:`script_config` is what a script calls for its settings: the defaults, then the YAML files
and then the ``--set`` overrides given to ``marin run`` for that name (see
:mod:`marin.execution.planning.run_defaults`). Under plain ``python`` there is no launch and the defaults are
returned; the script's own ``sys.argv`` is left to the script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import yaml
from rigging.config import settings_file
from rigging.config.errors import ConfigError as SettingsFileError

from marin.execution.planning.run_defaults import ConfigError, current_launch

T = TypeVar("T")

_MISSING = object()

MAX_CONFIG_BYTES = settings_file.MAX_SETTINGS_BYTES
MAX_CONFIG_VALUES = settings_file.MAX_SETTINGS_VALUES


def apply_overrides(config: T, overrides: Sequence[str]) -> T:
    """A copy of the frozen dataclass ``config`` with each ``"a.b.c=value"`` applied, in order."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of 'key=value' strings, got the single string {overrides!r}.")
    for override in overrides:
        key, sep, text = override.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"Override {override!r} is not of the form key=value (e.g. trainer.num_train_steps=100).")
        value = _parse_value(text, key) if text.strip() else ""
        config = _set_path(config, key.split("."), value, text.strip(), key)
    return config


def load_config(cls: type[T], path: str) -> T:
    """An instance of ``cls`` from a YAML file (a path or URL); fields not in the file keep their defaults."""
    return _from_mapping(cls, _read_yaml(path), where=str(path))


def dump_config(config: Any) -> str:
    """``config`` as YAML that :func:`load_config` reads back to an equal instance."""
    return yaml.safe_dump(_to_plain(config), sort_keys=False)


def script_config(cls: type[T], name: str, default: T | None = None) -> T:
    """A script's settings called ``name``: ``default`` (or ``cls()``), then ``marin run --config
    name=FILE.yaml`` files, then ``--set name.key=value`` overrides, each in the order given."""
    config = default if default is not None else cls()
    launched = current_launch()
    if launched is None:
        return config
    launched.configs_read.add(name)
    for config_name, path in launched.overrides.config_files:
        if config_name == name:
            config = _merge(config, _read_yaml(path), where=str(path))
    prefix = f"{name}."
    mine = [setting[len(prefix) :] for setting in launched.overrides.settings if setting.startswith(prefix)]
    return apply_overrides(config, mine)


def _read_yaml(path: str) -> Mapping[str, Any]:
    label = f"Config file {path}"
    with _as_marin_error():
        data = settings_file.parse_settings_yaml(settings_file.read_settings_text(str(path), label), label)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"Config file {path} must hold a mapping of field names to values, got {type(data).__name__}.")
    return data


def _parse_value(text: str, key: str) -> Any:
    """An override's value, read as YAML with the same strictness as a file."""
    with _as_marin_error():
        return settings_file.parse_settings_yaml(text, f"Override {key!r}")


@contextlib.contextmanager
def _as_marin_error() -> Iterator[None]:
    # rigging reads the file; callers here catch marin's ConfigError, so the refusal is re-raised as one.
    try:
        yield
    except SettingsFileError as exc:
        raise ConfigError(str(exc)) from None


def _fields(cls: type) -> dict[str, Any]:
    """The init fields of dataclass ``cls`` and their resolved types."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # annotations naming things not importable here: use the raw ones
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls) if f.init}


def _field_type(config_cls: type, name: str, key: str) -> Any:
    fields = _fields(config_cls)
    if name not in fields:
        close = difflib.get_close_matches(name, list(fields), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else f" Its fields: {', '.join(fields)}."
        raise ConfigError(f"Unknown setting {key!r}: {config_cls.__name__} has no field {name!r}.{hint}")
    return fields[name]


def _set_path(config: Any, path: list[str], value: Any, text: str | None, key: str) -> Any:
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        done = key[: len(key) - len(".".join(path)) - 1]
        raise ConfigError(f"Cannot set {key!r}: {done!r} is {config!r}, not a config with fields.")
    name, rest = path[0], path[1:]
    tp = _field_type(type(config), name, key)
    if rest == [TYPE_KEY] and _registry_of(_dataclass_in(tp)) is not None:  # another member of the family
        new = _switched(getattr(config, name), _parse_type(_dataclass_in(tp), value, key), key)
    elif rest:
        new = _set_path(getattr(config, name), rest, value, text, key)
    else:
        new = _convert(tp, value, key, text)
    return _checked(lambda: dataclasses.replace(config, **{name: new}), [key])


def _merge(config: Any, mapping: Mapping[str, Any], where: str, path: str = "") -> Any:
    """``config`` with the values of ``mapping`` set; nested mappings update nested configs field by field."""
    changes = {}
    for name, value in mapping.items():
        key = f"{path}{name}"
        tp = _field_type(type(config), str(name), f"{where}: {key}")
        current = getattr(config, name)
        member = _member_named(tp, value, f"{where}: {key}")
        if member is not None and not isinstance(current, member):  # another member: built anew from the mapping
            changes[name] = _from_mapping(member, _without_type(value), where, f"{key}.")
        elif isinstance(value, Mapping) and dataclasses.is_dataclass(current):
            changes[name] = _merge(current, _without_type(value), where, f"{key}.")
        else:
            changes[name] = _convert(tp, value, f"{where}: {key}")
    return _checked(lambda: dataclasses.replace(config, **changes), [f"{where}: {path}{name}" for name in changes])


def _checked(build: Any, keys: Sequence[str]) -> Any:
    """``build()``, with a refusal by the config's own checks (``__post_init__``) as a ConfigError
    naming the keys set."""
    try:
        return build()
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"Bad value for {', '.join(repr(key) for key in keys)}: {exc}") from None


def _from_mapping(cls: type, mapping: Mapping[str, Any], where: str, path: str = "") -> Any:
    members = _registry_of(cls)
    if members is not None and not getattr(cls, "type_name", ""):
        at = path.rstrip(".") or cls.__name__
        raise ConfigError(f"{where}: {at} needs a {TYPE_KEY!r} key naming which {cls.__name__} "
                          f"(one of {', '.join(sorted(members))}).")
    fields = _fields(cls)
    kwargs = {}
    for name, value in mapping.items():
        key = f"{path}{name}"
        tp = _field_type(cls, str(name), f"{where}: {key}")
        if isinstance(value, Mapping) and _dataclass_in(tp) is not None:
            member = _member_named(_dataclass_in(tp), value, f"{where}: {key}") or _dataclass_in(tp)
            kwargs[name] = _from_mapping(member, _without_type(value), where, f"{key}.")
        else:
            kwargs[name] = _convert(tp, value, f"{where}: {key}")
    try:
        return _checked(lambda: cls(**kwargs), [f"{where}: {path}{name}" for name in kwargs])
    except TypeError as exc:
        missing = [name for name in fields if name not in kwargs]
        raise ConfigError(f"{where}: cannot build {cls.__name__}{' at ' + path.rstrip('.') if path else ''} "
                          f"({exc}); fields not given: {', '.join(missing) or 'none'}.") from exc


# -- families of configs chosen by name (``type:``) ---------------------------------------------------

TYPE_KEY = "type"


def _registry_of(cls: Any) -> dict[str, type] | None:
    """``{name: member}`` when ``cls`` belongs to a family of configs with a registry, else None."""
    registered = getattr(cls, "registered", None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and callable(registered)):
        return None
    members = registered()
    return members if isinstance(members, dict) else None


def _parse_type(declared: type, name: Any, key: str) -> type:
    """The member of ``declared``'s family named ``name``; a ConfigError listing the choices otherwise."""
    members = {n: m for n, m in (_registry_of(declared) or {}).items() if issubclass(m, declared)}
    if name not in members:
        raise ConfigError(f"Bad value for {key!r}: {name!r} is not a {declared.__name__}; "
                          f"choose one of {', '.join(sorted(members))}.")
    return members[name]


def _member_named(declared: Any, value: Any, key: str) -> type | None:
    """The member a mapping's ``type:`` names, for a field declared as a family of configs; None when the
    field is no such family or the mapping names none."""
    if not isinstance(value, Mapping) or TYPE_KEY not in value or _registry_of(declared) is None:
        return None
    return _parse_type(declared, value[TYPE_KEY], f"{key}.{TYPE_KEY}")


def _without_type(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return {k: v for k, v in value.items() if k != TYPE_KEY}


def _switched(config: Any, member: type, key: str) -> Any:
    """``config`` as ``member``: the fields both have keep their values, the others take their defaults."""
    if type(config) is member:
        return config
    shared = {f.name for f in dataclasses.fields(member) if f.init}
    kept = {} if config is None else {
        f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init and f.name in shared}
    try:
        return _checked(lambda: member(**kept), [key])
    except TypeError as exc:
        raise ConfigError(f"Cannot set {key!r}: {member.__name__} needs fields the setting does not carry ({exc}); "
                          f"give them in a config file with {TYPE_KEY!r}.") from None


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass ``tp`` names, also inside ``Optional[...]``."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    if _is_union(tp):
        found = [arg for arg in typing.get_args(tp) if dataclasses.is_dataclass(arg)]
        return found[0] if len(found) == 1 else None
    return None


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, key: str, text: str | None = None) -> Any:
    """``value`` as an instance of ``tp``, or a :class:`ConfigError` naming ``key`` and the type."""
    result = _try_convert(tp, value, key, text)
    if result is _MISSING:
        shown = text if text is not None else repr(value)
        raise ConfigError(f"Bad value for {key!r}: expected {_type_name(tp)}, got {shown} ({type(value).__name__}).")
    return result


def _try_convert(tp: Any, value: Any, key: str, text: str | None) -> Any:
    if tp is Any or tp is object:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            result = _try_convert(arg, value, key, text)
            if result is not _MISSING:
                return result
        return _MISSING
    if origin is typing.Literal:
        return value if value in args else _MISSING
    if tp is bool:
        return value if isinstance(value, bool) else _MISSING
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                return _MISSING
        return _MISSING
    if tp is str:
        if isinstance(value, str):
            return value
        if text is not None:  # `name=123` or `mode=yes` on the command line means the text
            return text
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _MISSING
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if value == member.value or value == member.name:
                return member
        return _MISSING
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return _MISSING
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                return _MISSING
            items = [_convert(arg, item, f"{key}[{i}]") for i, (arg, item) in enumerate(zip(args, value, strict=True))]
        else:
            item_type = args[0] if args else Any
            items = [_convert(item_type, item, f"{key}[{i}]") for i, item in enumerate(value)]
        return list(items) if origin is list or tp is list else tuple(items)
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            return _MISSING
        key_type, value_type = args if args else (Any, Any)
        return {_convert(key_type, k, key): _convert(value_type, v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            return _MISSING
        return _from_mapping(_member_named(tp, value, key) or tp, _without_type(value), key)
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _MISSING
    raise ConfigError(f"Cannot set {key!r}: its type {_type_name(tp)} is not one settings support.")


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        plain = {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        named = getattr(type(value), "type_name", "") if _registry_of(type(value)) is not None else ""
        return {TYPE_KEY: named, **plain} if named else plain
    if isinstance(value, enum.Enum):
        return _to_plain(value.value)
    if isinstance(value, (list, tuple)):
        return [_to_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _to_plain(item) for key, item in value.items()}
    return value


__all__ = ["ConfigError", "apply_overrides", "dump_config", "load_config", "script_config"]
