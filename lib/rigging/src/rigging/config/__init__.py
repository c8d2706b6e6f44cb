"""Where Marin's settings come from: see :mod:`rigging.config.discovery`."""

from rigging.config.discovery import MarinConfig, discover_config
from rigging.config.errors import ConfigError, PrefixUnusableError

__all__ = ["ConfigError", "MarinConfig", "PrefixUnusableError", "discover_config"]
