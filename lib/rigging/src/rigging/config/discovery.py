"""Find Marin's settings (at least the output ``prefix``) without the user wiring anything.

Precedence, highest first:

1. explicit keyword arguments to :func:`discover_config`;
2. environment variables (``MARIN_PREFIX``, ``MARIN_LOG_LEVEL``, ``MARIN_CLUSTER``);
3. the nearest ``marin.yaml`` found walking up from the working directory;
4. ``[tool.marin]`` in the nearest ``pyproject.toml`` walking up from the working directory;
5. defaults: ``prefix`` is the folder ``marin-outputs`` next to the project file found in (3)/(4),
   or in the working directory when there is none.

A relative ``prefix`` in a file is resolved against that file's folder, so the same project gives
the same prefix from whichever subfolder it is run. A prefix URL whose storage cannot be reached
from this Python (an unknown protocol, ``gs://`` without ``gcsfs``) is refused here, naming the
setting that chose it, rather than failing later inside fsspec. Both files are read as
:mod:`rigging.config.settings_file` reads settings (bounded, strict, one-line refusals); a file by
either name that cannot be read (a FIFO, a link to nothing) is refused rather than skipped, and
every setting a file gives must be text.
"""

from __future__ import annotations

import copy
import functools

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigging.config.errors import ConfigError, PrefixUnusableError
from rigging.config.settings_file import parse_settings_toml, parse_settings_yaml, read_settings_text
from rigging.filesystem import FilesystemUnavailableError, UnknownProtocolError, check_protocol

DEFAULT_OUTPUT_FOLDER = "marin-outputs"

# Setting name -> environment variable that overrides it.
ENVIRONMENT_VARIABLES = {
    "prefix": "MARIN_PREFIX",
    "log_level": "MARIN_LOG_LEVEL",
    "cluster": "MARIN_CLUSTER",
}


@dataclass(frozen=True)
class MarinConfig:
    """Resolved settings.

    ``prefix`` is where step outputs go: a local folder or any fsspec URL. ``sources`` says, per
    setting, where its value came from (``"argument"``, ``"env:MARIN_PREFIX"``, a file path or
    ``"default"``) so logs can say why a run wrote where it did.
    """

    prefix: str
    log_level: str = "INFO"
    cluster: str | None = None  # where work runs: "local", "ray:auto", "ray://host:port" (see fray.cluster.current)
    project_root: str | None = None
    sources: tuple[tuple[str, str], ...] = ()

    def source_of(self, setting: str) -> str:
        return dict(self.sources).get(setting, "default")


_SETTINGS = ("prefix", "log_level", "cluster")


def _is_url(value: str) -> bool:
    return "://" in value


def _resolve_prefix(value: str, base: Path) -> str:
    value = os.path.expanduser(str(value))
    if _is_url(value) and not value.startswith("file://"):
        return value.rstrip("/")
    if value.startswith("file://"):
        value = value[len("file://") :]
    return os.path.realpath(os.path.join(base, value))  # an absolute value replaces base


def _find_upwards(start: str, filename: str) -> Path | None:
    # Anything by that name counts (a link to nothing, a FIFO): reading it then says why it cannot
    # be used, where skipping it would drop the settings the person meant without a word. Plain
    # strings, not Paths: every runner looks, and pathlib costs several times as much.
    folder = start
    while True:
        candidate = os.path.join(folder, filename)
        if os.path.lexists(candidate):
            return Path(candidate)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _read_marin_yaml(path: Path) -> dict[str, Any]:
    data = parse_settings_yaml(read_settings_text(str(path), str(path)), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping such as 'prefix: gs://bucket/marin', got {type(data).__name__}.")
    return data


def _read_pyproject(path: Path) -> dict[str, Any] | None:
    section = _marin_table(read_settings_text(str(path), str(path)), str(path))
    return copy.deepcopy(section)


@functools.lru_cache(maxsize=16)
def _marin_table(text: str, label: str) -> dict[str, Any] | None:
    # Parsed once per content: a script's runners each look for settings, and a pyproject.toml is
    # mostly other tools' tables (milliseconds to parse).
    data = parse_settings_toml(text, label)
    section = data.get("tool", {}).get("marin")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"[tool.marin] in {label} must be a table.")
    return section


def _check_keys(values: dict[str, Any], where: str) -> None:
    unknown = sorted(set(values) - set(_SETTINGS))
    if unknown:
        raise ConfigError(f"Unknown Marin setting(s) {unknown} in {where}; known settings: {list(_SETTINGS)}.")


def _file_settings(section: dict[str, Any], where: str) -> dict[str, str]:
    """The settings a file gives: known keys with text values; an empty value (``cluster:``) gives none."""
    _check_keys(section, where)
    for key, value in section.items():
        if value is not None and not isinstance(value, str):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ConfigError(f"Marin setting {key!r} must be text, got {shown} ({type(value).__name__}) in {where}.")
    return {key: value for key, value in section.items() if value is not None}


def _describe_source(source: str) -> tuple[str, str]:
    """(what set the prefix, how to choose another) for a ``MarinConfig.sources`` entry."""
    if source.startswith("env:"):
        variable = source[len("env:") :]
        return f"the environment variable {variable}", f"set {variable} to a local folder or another URL (or unset it)"
    if source == "argument":
        return "the --prefix option or prefix= argument", "give a local folder or another URL"
    return f"'prefix' in {source}", f"change 'prefix' in {source}"


def _check_prefix(prefix: str, source: str) -> None:
    try:
        check_protocol(prefix)
    except FilesystemUnavailableError as exc:
        setter, choose_another = _describe_source(source)
        if isinstance(exc, UnknownProtocolError):
            remedy = f"{choose_another[0].upper()}{choose_another[1:]}, e.g. gs://bucket/marin or s3://bucket/marin."
        else:
            remedy = f"To fix it: {exc.remedy}; or {choose_another}."
        raise PrefixUnusableError(
            f"The Marin prefix {prefix!r} (set by {setter}) cannot be used: {exc.reason}. {remedy}"
        ) from None


def discover_config(
    *, prefix: str | None = None, cwd: str | os.PathLike | None = None, check_prefix: bool = True, **overrides: Any
) -> MarinConfig:
    """Resolve Marin's settings; see the module docstring for the order of precedence.

    ``cwd`` is where the upward search starts (default: the working directory). ``check_prefix``
    refuses a prefix whose storage cannot be opened here (:class:`PrefixUnusableError`); callers
    that want only another setting pass ``False``.
    """
    # The working directory as the system gives it has no links in it already.
    start = os.path.realpath(cwd) if cwd is not None else os.getcwd()
    explicit = {k: v for k, v in overrides.items() if v is not None}
    _check_keys(explicit, "discover_config() arguments")
    if prefix is not None:
        explicit["prefix"] = prefix

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    project_root: Path | None = None

    # Lowest precedence first; later layers overwrite earlier ones.
    pyproject = _find_upwards(start, "pyproject.toml")
    if pyproject is not None:
        section = _read_pyproject(pyproject)
        if section is not None:
            project_root = pyproject.parent
            for key, value in _file_settings(section, f"[tool.marin] of {pyproject}").items():
                values[key] = _resolve_prefix(value, pyproject.parent) if key == "prefix" else value
                sources[key] = str(pyproject)

    marin_yaml = _find_upwards(start, "marin.yaml")
    if marin_yaml is not None:
        section = _read_marin_yaml(marin_yaml)
        settings = _file_settings(section, str(marin_yaml))
        # The nearer project file names the project root.
        if project_root is None or len(marin_yaml.parent.parts) >= len(project_root.parts):
            project_root = marin_yaml.parent
        for key, value in settings.items():
            values[key] = _resolve_prefix(value, marin_yaml.parent) if key == "prefix" else value
            sources[key] = str(marin_yaml)

    if project_root is None and pyproject is not None:
        project_root = pyproject.parent

    for key, variable in ENVIRONMENT_VARIABLES.items():
        env_value = os.environ.get(variable)
        if env_value:
            values[key] = _resolve_prefix(env_value, start) if key == "prefix" else env_value
            sources[key] = f"env:{variable}"

    for key, value in explicit.items():
        values[key] = _resolve_prefix(value, start) if key == "prefix" else value
        sources[key] = "argument"

    if "prefix" not in values:
        values["prefix"] = os.path.join(project_root or start, DEFAULT_OUTPUT_FOLDER)
        sources["prefix"] = "default"

    if check_prefix:
        _check_prefix(values["prefix"], sources["prefix"])

    if "log_level" in values:
        values["log_level"] = str(values["log_level"]).upper()

    return MarinConfig(
        project_root=str(project_root) if project_root is not None else None,
        sources=tuple(sorted(sources.items())),
        **values,
    )

