"""Where Marin's settings come from: see :mod:`rigging.config.discovery`."""

from rigging.config.discovery import ConfigError, MarinConfig, PrefixUnusableError, discover_config

__all__ = ["ConfigError", "MarinConfig", "PrefixUnusableError", "discover_config"]
