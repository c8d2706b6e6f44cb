"""Reading a settings file a person wrote (``marin.yaml``, ``[tool.marin]``, ``marin run --config``):
bounded, strict, and refused in one line naming the file and, where it can, the line.

A settings file is a few kilobytes of text, so anything else is refused as a :class:`ConfigError`
before it can cost time or memory or escape as a traceback:

* only a regular file is read, opened by :func:`rigging.regular_files.open_regular`: a directory,
  a FIFO, a socket or a device is refused without being waited on; a link to nothing says so;
* at most :data:`MAX_SETTINGS_BYTES` are read, and the bytes must be UTF-8;
* YAML is read with the safe loader and held to what settings can be: no key twice in one mapping
  (YAML would keep the last silently); aliases (``&a`` / ``*a``) allowed, but the document they
  expand to is bounded (:data:`MAX_SETTINGS_VALUES`), linearly in the file's size; integers of at
  most :data:`MAX_INTEGER_DIGITS` digits (Python can neither read nor print longer ones in
  decimal); and a value the loader cannot build (``2024-13-45`` is no date) is named with its line;
* YAML and TOML syntax errors are one line: the problem, then where it is.

``label`` is how a message names the file ("Config file train.yaml", or the path found by
discovery); every message starts with it.
"""

from __future__ import annotations

import math
import os
import tomllib
from typing import Any

import yaml

from rigging import filesystem, regular_files
from rigging.config.errors import ConfigError

# Settings files are a few kilobytes; these bounds are far above any real one and far below what
# would cost noticeable memory or time, so only hostile or mistaken input meets them.
MAX_SETTINGS_BYTES = 1024 * 1024
MAX_SETTINGS_VALUES = 100_000
# Python's own limit on turning decimal text into an int and back (sys.int_info.default_max_str_digits).
MAX_INTEGER_DIGITS = 4300
_INTEGER_BOUND = 10**MAX_INTEGER_DIGITS

# What a YAML tag's value should have been, for the message when it cannot be built.
_TAG_KINDS = {
    "tag:yaml.org,2002:int": "an integer",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:bool": "true or false",
    "tag:yaml.org,2002:timestamp": "a date",
    "tag:yaml.org,2002:binary": "base64 data",
}


def read_settings_text(url: str, label: str) -> str:
    """The text of the settings file at ``url`` (a path or URL), or a :class:`ConfigError`."""
    try:
        data = regular_files.read_bounded(url, MAX_SETTINGS_BYTES)
    except regular_files.FileTooLargeError:
        fs, path = filesystem.filesystem(url)
        raise ConfigError(f"{label} is {fs.size(path):,} bytes; config files are limited to {MAX_SETTINGS_BYTES:,} "
                          "bytes (they hold settings, not data).") from None
    except regular_files.RefusedFileError as exc:
        raise ConfigError(f"{label} is {exc.reason}; give the path of a settings file.") from None
    except OSError as exc:
        raise ConfigError(f"{label} cannot be read: {exc.strerror or exc}.") from None
    if data is None:
        local_path = filesystem.filesystem(url)[1] if filesystem.is_local(url) else None
        if local_path is not None and os.path.islink(local_path):
            raise ConfigError(f"{label} is a link to a file that does not exist ({os.readlink(local_path)}).") from None
        raise ConfigError(f"{label} does not exist.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label} is not UTF-8 text (byte {exc.start}).") from None


def parse_settings_yaml(text: str, label: str) -> Any:
    """The YAML document in ``text``, read strictly (see the module docstring); ``None`` when empty."""
    try:
        loader = _SettingsLoader(text)
        loader.label = label
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_document(node, label)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label} is not valid YAML: {_yaml_problem(exc)}.") from None
    except RecursionError:
        raise ConfigError(f"{label} is nested too deeply to be a settings file.") from None


def parse_settings_toml(text: str, label: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label} is not valid TOML: {exc}") from None
    except ValueError:  # tomllib's int() of a number past the digit limit; it does not say where
        raise ConfigError(f"{label} cannot be read as TOML: it holds an integer of more than "
                          f"{MAX_INTEGER_DIGITS:,} digits.") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: the problem and its line and column (PyYAML's own spans lines)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or not exc.problem:
        return " ".join(str(exc).split())
    text = exc.problem
    if exc.problem_mark is not None:
        text += f" (line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1})"
    if exc.context:
        text += f", {exc.context}"
        if exc.context_mark is not None and exc.context_mark is not exc.problem_mark:
            text += f" from line {exc.context_mark.line + 1}"
    return text


def _decimal_digits(value: int) -> int:
    """How many decimal digits ``value`` has, without printing it (which fails past the digit limit)."""
    value = abs(value)
    estimate = int(value.bit_length() * math.log10(2))  # the count, or one more than it
    return estimate + 1 if value >= 10**estimate else estimate


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


class _SettingsLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with a value it cannot build refused naming its line."""

    label = ""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        where = f"{self.label}, line {node.start_mark.line + 1}"
        try:
            value = super().construct_object(node, deep=deep)
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            if isinstance(exc, ConfigError):
                raise
            text = node.value if isinstance(node, yaml.ScalarNode) else ""
            digits = text.lstrip("+-").replace("_", "")
            if node.tag == "tag:yaml.org,2002:int" and digits.isdigit() and len(digits) > MAX_INTEGER_DIGITS:
                raise _too_many_digits(where, len(digits)) from None
            kind = _TAG_KINDS.get(node.tag, f"a value of type {node.tag}")
            reason = f" ({exc})" if isinstance(exc, ValueError) and len(str(exc)) < 120 else ""
            raise ConfigError(f"{where}: {_shown(text)} cannot be read as {kind}{reason}.") from None
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INTEGER_BOUND:
            raise _too_many_digits(where, _decimal_digits(value))
        return value


def _too_many_digits(where: str, digits: int) -> ConfigError:
    return ConfigError(f"{where}: an integer of {digits:,} digits; settings hold integers of at most "
                       f"{MAX_INTEGER_DIGITS:,} digits (quote it to give text).")


def _check_document(root: yaml.Node, label: str) -> None:
    """Refuse duplicate keys and documents whose aliases expand past :data:`MAX_SETTINGS_VALUES`.

    Works on the composed node graph, where an alias is a shared node: each node is visited once
    and its expanded size remembered, so the check is linear in the file however far it would expand.
    """
    sizes: dict[int, int | None] = {}

    def expanded(node: yaml.Node, key: str) -> int:
        if id(node) in sizes:
            size = sizes[id(node)]
            if size is None:
                where = key.rstrip(".") or "the document"
                raise ConfigError(f"{label}: {where} contains itself through an alias "
                                  f"(line {node.start_mark.line + 1}).")
            return size
        sizes[id(node)] = None
        size = 1
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(node, key, label)
            for key_node, value_node in node.value:
                size += expanded(key_node, key) + expanded(value_node, f"{key}{key_node.value}.")
        elif isinstance(node, yaml.SequenceNode):
            size += sum(expanded(item, key) for item in node.value)
        if size > MAX_SETTINGS_VALUES:
            raise ConfigError(f"{label}: through YAML aliases (*name) it expands to more than "
                              f"{MAX_SETTINGS_VALUES:,} values; write the settings out, or use fewer aliases.")
        sizes[id(node)] = size
        return size

    expanded(root, "")


def _refuse_duplicate_keys(node: yaml.MappingNode, key: str, label: str) -> None:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue  # a merge key (<<) overriding merged values is YAML's own, explicit, way to override
        line = key_node.start_mark.line + 1
        if key_node.value in seen:
            raise ConfigError(f"{label}: the key {key + key_node.value!r} appears twice, on lines "
                              f"{seen[key_node.value]} and {line}; keep one.")
        seen[key_node.value] = line


__all__ = ["MAX_INTEGER_DIGITS", "MAX_SETTINGS_BYTES", "MAX_SETTINGS_VALUES", "parse_settings_toml",
           "parse_settings_yaml", "read_settings_text"]
