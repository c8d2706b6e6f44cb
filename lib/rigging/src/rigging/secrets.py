"""Secrets: which environment variables hold credentials, and keeping their values out of what is kept.

A secret is an environment variable whose value is a credential (a W&B key, a Hugging Face token,
a cloud secret key). Its *name* may be recorded anywhere (a job's record lists the names it passes
on); its *value* goes only into the environment of the processes that use it. Two promises follow:

* :func:`split_secrets` separates the secret variables of an environment from the others, so a job
  can be recorded with the names alone and handed the values only when it starts;
* :func:`redact` and :class:`RedactingStream` replace every known secret value (one of the current
  environment's secret variables of at least :data:`MIN_REDACTED_LENGTH` characters) with
  :data:`REDACTED` in text on its way to a kept log or record. Shorter values are left alone: a
  value like ``1`` or ``true`` would blank out every occurrence of it in a log and protects nothing.

Which names are secrets: :data:`KNOWN_SECRET_NAMES`, every name matching :data:`SECRET_NAME_PATTERNS`,
and the names and ``*`` patterns a user lists in :data:`SECRET_NAMES_VARIABLE` (commas or spaces
between them). A variable that only *points at* credentials (``GOOGLE_APPLICATION_CREDENTIALS``, a
path) is no secret, but the keys inside the file it names are known values to redact.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from rigging.errors import RiggingError

SECRET_NAMES_VARIABLE = "MARIN_SECRET_NAMES"
KNOWN_SECRET_NAMES = frozenset({
    "WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
})
SECRET_NAME_PATTERNS = ("*_TOKEN", "*_SECRET*", "*_PASSWORD", "*_API_KEY")
# Variables whose names match a pattern but whose values are settings, not credentials.
NOT_SECRETS = frozenset({SECRET_NAMES_VARIABLE})
# Variables naming a credentials file (JSON): the file's keys below are secret values.
CREDENTIALS_FILE_VARIABLES = ("GOOGLE_APPLICATION_CREDENTIALS",)
CREDENTIALS_FILE_KEYS = ("private_key", "private_key_id", "client_secret", "refresh_token")
MAX_CREDENTIALS_FILE_BYTES = 1 << 20
MIN_REDACTED_LENGTH = 8
REDACTED = "***"
_REDACTED_BYTES = REDACTED.encode()

_NAME_OR_PATTERN = re.compile(r"^[A-Za-z_*][A-Za-z0-9_*]*$")
AnyStr = TypeVar("AnyStr", str, bytes)


class SecretNamesError(RiggingError, ValueError):
    """``MARIN_SECRET_NAMES`` lists something that is not a variable name or ``*`` pattern."""


@dataclass(frozen=True)
class SecretNames:
    """Which variable names are secrets: the built-in list and patterns, plus the user's own.

    ``named`` holds the names and patterns said explicitly (the built-in list and the user's
    setting): those are worth passing on to a job even where no prefix rule would, whereas a name
    that is a secret only by the built-in patterns (any ``*_TOKEN``) is kept secret but not sent.
    """

    named: tuple[str, ...] = tuple(sorted(KNOWN_SECRET_NAMES))
    patterns: tuple[str, ...] = SECRET_NAME_PATTERNS

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, *, strict: bool = True) -> SecretNames:
        """The built-in names plus those of ``MARIN_SECRET_NAMES`` in ``environ`` (default ``os.environ``).

        ``strict=False`` skips entries that are not names or patterns instead of raising
        :class:`SecretNamesError` (for paths, such as a log formatter, that must not fail).
        """
        environ = os.environ if environ is None else environ
        return _parse_setting(environ.get(SECRET_NAMES_VARIABLE, ""), strict)

    def is_named(self, name: str) -> bool:
        """Said to be a secret explicitly (the built-in list or the user's setting)."""
        upper = name.upper()
        return upper not in NOT_SECRETS and _matcher(self.named).match(upper) is not None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _names_a_secret(self, name)


# Asked for every variable of the environment at every log record and record written: each answer
# once per setting and name.
@functools.lru_cache(maxsize=4096)
def _names_a_secret(names: SecretNames, name: str) -> bool:
    upper = name.upper()
    return upper not in NOT_SECRETS and _matcher(names.named + names.patterns).match(upper) is not None


# Both are asked for every variable of the environment at every log record: parsed and compiled once.
@functools.lru_cache(maxsize=16)
def _parse_setting(setting: str, strict: bool) -> SecretNames:
    user = []
    for entry in re.split(r"[\s,]+", setting.strip()):
        if not entry:
            continue
        if not _NAME_OR_PATTERN.match(entry):
            if not strict:
                continue
            raise SecretNamesError(
                f"{SECRET_NAMES_VARIABLE} lists {entry!r}, which is not an environment variable name or a '*' "
                f"pattern; separate names with commas, e.g. {SECRET_NAMES_VARIABLE}=OPENAI_API_KEY,MYORG_*."
            )
        user.append(entry.upper())
    return SecretNames(named=tuple(sorted(KNOWN_SECRET_NAMES | set(user))))


@functools.lru_cache(maxsize=64)
def _matcher(entries: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(fnmatch.translate(entry) for entry in entries) or "(?!)")


def split_secrets(env: Mapping[str, str], names: SecretNames | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` as (the variables that are not secrets, the secret ones).

    Without ``names``, the user's setting is read from ``env`` and ``os.environ`` together, so a
    job's own ``MARIN_SECRET_NAMES`` counts as well as the submitter's.
    """
    if names is None:
        names = SecretNames.from_environment({**os.environ, **env})
    public = {key: value for key, value in env.items() if key not in names}
    secret = {key: value for key, value in env.items() if key in names}
    return public, secret


def secret_values(environ: Mapping[str, str] | None = None, *, strict: bool = False) -> tuple[str, ...]:
    """Every known secret value of ``environ`` (default ``os.environ``) long enough to redact, longest first."""
    if environ is not None and environ is not os.environ:
        return _secret_values(environ, strict)
    # Asked at every record a run writes and every log line: the process's own environment is read
    # again only when it has changed (one comparison of two dicts, in C, instead of a Python loop
    # over every variable), and a credentials file only when its size or time has.
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):
        return _secret_values(os.environ, strict)
    files = tuple(_credentials_file_version(os.environ.get(variable)) for variable in CREDENTIALS_FILE_VARIABLES)
    last = _environ_values.get(strict)
    if last is not None and last[1] == files and last[0] == data:
        return last[2]
    snapshot = dict(data)
    values = _secret_values(os.environ, strict)
    _environ_values[strict] = (snapshot, files, values)  # replaced whole: a thread reading it sees one or the other
    return values


# The process environment's secret values as last computed: strict -> (its variables then, the
# credentials files' versions then, the values).
_environ_values: dict[bool, tuple[dict, tuple, tuple[str, ...]]] = {}


def _secret_values(environ: Mapping[str, str], strict: bool) -> tuple[str, ...]:
    names = SecretNames.from_environment(environ, strict=strict)
    values = {value for key, value in environ.items() if key in names}
    for variable in CREDENTIALS_FILE_VARIABLES:
        if environ.get(variable):
            values.update(_credentials_file_values(environ[variable]))
    return tuple(sorted((value for value in values if len(value) >= MIN_REDACTED_LENGTH), key=lambda v: (-len(v), v)))


def _credentials_file_version(path: str | None) -> tuple[str, int, int] | None:
    """What tells a credentials file's content apart from its last reading: its path, time and size."""
    if not path:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (path, stat.st_mtime_ns, stat.st_size)


# The credentials file last read, as ((path, mtime, size), its values): one file in practice, read
# again only when it changes. Replaced whole, so a thread reading it meanwhile sees one or the other.
_credentials_read: tuple[tuple[str, int, int], tuple[str, ...]] | None = None


def _credentials_file_values(path: str) -> tuple[str, ...]:
    """The secret keys of a JSON credentials file, and each line of multi-line ones (a PEM key is
    printed line by line as often as whole). Unreadable, or not such a file: none."""
    global _credentials_read
    version = _credentials_file_version(path)
    if version is None:
        return ()
    last = _credentials_read
    if last is not None and last[0] == version:
        return last[1]
    found: list[str] = []
    try:
        if version[2] <= MAX_CREDENTIALS_FILE_BYTES:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            for name in CREDENTIALS_FILE_KEYS:
                value = data.get(name) if isinstance(data, dict) else None
                if isinstance(value, str) and value:
                    found.append(value)
                    # The armour lines (-----BEGIN ...) are the same in every key: not secret.
                    found.extend(line for line in value.splitlines() if line.strip() and not line.startswith("-----"))
    except (OSError, ValueError):
        pass
    _credentials_read = (version, tuple(found))
    return _credentials_read[1]


def redact(text: AnyStr, values: Iterable[str] | None = None) -> AnyStr:
    """``text`` (str or bytes) with every known secret value (``values``, default
    :func:`secret_values`) replaced by :data:`REDACTED`."""
    values = secret_values() if values is None else values
    for value in sorted(values, key=len, reverse=True):  # a value that contains another goes first
        if isinstance(text, bytes):
            text = text.replace(value.encode("utf-8"), _REDACTED_BYTES)
        else:
            text = text.replace(value, REDACTED)
    return text


def redact_argv(argv: Iterable[str], environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """A command line fit to record: known secret values replaced, and so is the value of any option
    or ``key=value`` whose key names a secret (``--hf-token X``, ``--set wandb.api_key=X``), known or not."""
    environ = os.environ if environ is None else environ
    return _redacted_argv(tuple(argv), SecretNames.from_environment(environ, strict=False), secret_values(environ))


@functools.lru_cache(maxsize=64)
def _redacted_argv(argv: tuple[str, ...], names: SecretNames, values: tuple[str, ...]) -> tuple[str, ...]:
    # Once per command line and secrets: every step's record of a run quotes the same one.
    recorded: list[str] = []
    hide_next = False
    for argument in argv:
        if hide_next and not argument.startswith("-"):
            recorded.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        key, equals, _ = argument.partition("=")
        if equals and _names_secret(key, names):
            recorded.append(f"{key}={REDACTED}")
            continue
        hide_next = argument.startswith("--") and not equals and _names_secret(argument, names)
        recorded.append(redact(argument, values))
    return tuple(recorded)


def _names_secret(key: str, names: SecretNames) -> bool:
    """Whether an option or dotted setting (``--hf-token``, ``wandb.api_key``) spells a secret's name.

    A name said explicitly counts, and so do the patterns, except ``*_TOKEN``: a command line of
    this project is full of tokenizer settings (``--eos-token``, ``pad_token=``) that are no secrets.
    """
    spelled = "_" + re.sub(r"[^A-Za-z0-9]+", "_", key.lstrip("-")).upper().strip("_")
    if spelled == "_":
        return False
    return names.is_named(spelled[1:]) or any(
        fnmatch.fnmatchcase(spelled, pattern) for pattern in names.patterns if pattern != "*_TOKEN")


class RedactingStream:
    """Redacts bytes that arrive in pieces, where a secret may be split between two pieces.

    :meth:`feed` returns what is safe to write now; it holds back the end of what it was given only
    while that end could be the start of a secret, and :meth:`flush` returns it once no more is coming.
    The values are fixed when the stream is made (default: :func:`secret_values` at that moment).
    """

    def __init__(self, values: Iterable[str] | None = None) -> None:
        values = secret_values() if values is None else values
        self._values = sorted({value.encode("utf-8") for value in values if value}, key=len, reverse=True)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        if not self._values:
            return data
        text = self._held + data
        for value in self._values:
            text = text.replace(value, _REDACTED_BYTES)
        keep = self._partial_secret_at_end(text)
        self._held = text[len(text) - keep:] if keep else b""
        return text[: len(text) - keep]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def _partial_secret_at_end(self, text: bytes) -> int:
        """The length of the longest end of ``text`` that some secret starts with (0: none)."""
        longest = 0
        for value in self._values:
            for length in range(min(len(value) - 1, len(text)), longest, -1):
                if text.endswith(value[:length]):
                    longest = length
                    break
        return longest
