"""The error for settings that cannot be used as written (kept apart so every config module can raise it)."""

from __future__ import annotations

from rigging.errors import RiggingError


class ConfigError(RiggingError, ValueError):
    """A settings file or override that cannot be used as written."""


class PrefixUnusableError(ConfigError):
    """The chosen output prefix names storage this Python cannot open; says which setting chose it."""
