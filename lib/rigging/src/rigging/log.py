"""Logging set-up, in one place, so every Marin package logs the same way.

Library modules only call :func:`get_logger`; entry points (the ``marin`` CLI, scripts, the step
runner when nothing is configured yet) call :func:`setup_logging` once. What it prints has the
known secret values of the environment redacted (:mod:`rigging.secrets`): a process's stderr is
often kept in a file (iris's supervisor log, a replica's log).
"""

from __future__ import annotations

import logging
import os
import sys

from rigging.secrets import SecretNames, redact, secret_values

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"

_HANDLER_MARK = "_marin_handler"

# Libraries whose INFO lines read like failures on an ordinary machine (JAX reports at INFO that it
# found no TPU), or repeat on every new connection (the S3 client says where it found credentials and
# its endpoint); they are shown only at DEBUG.
QUIET_LOGGERS = ("jax._src.xla_bridge", "aiobotocore.credentials", "botocore.credentials", "botocore.configprovider")


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


class RedactingFormatter(logging.Formatter):
    """Formats as usual, then replaces known secret values (read at each record: a program may set
    a credential in its environment after logging was set up)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), secret_values())


def setup_logging(level: int | str | None = None, *, stream=None, force: bool = False) -> None:
    """Send Marin's log records to ``stream`` (stderr) at ``level`` (``MARIN_LOG_LEVEL`` or INFO).

    Idempotent: a second call only changes the level, unless ``force`` replaces the handler. If
    the application already configured the root logger, Marin leaves its handlers alone.
    """
    if level is None:
        level = os.environ.get("MARIN_LOG_LEVEL", "INFO")
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError("log level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL.")
    SecretNames.from_environment()  # a malformed MARIN_SECRET_NAMES is refused here, where a program starts
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]
    if force:
        for handler in ours:
            root.removeHandler(handler)
        ours = []
    if not ours and (force or not root.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(RedactingFormatter(LOG_FORMAT, DATE_FORMAT))
        setattr(handler, _HANDLER_MARK, True)
        root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= logging.DEBUG else logging.WARNING)


def is_configured() -> bool:
    return bool(logging.getLogger().handlers)
