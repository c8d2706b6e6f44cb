"""A step's own output, copied into its attempt log while it runs in a thread of a shared process.

Steps run in the runner's threads (or in a fray worker's), beside other steps, so a process-wide
redirect would mix them. Instead, while :func:`captured_into` is active in the thread that calls
the step's function, what that thread prints (``sys.stdout``, ``sys.stderr``) and logs (the root
logger) is appended to the step's :class:`~iris.attempt_log.AttemptLog` too; the terminal still
sees everything as before. Other threads are untouched. Threads the step starts itself and output
written below Python (a C library writing to file descriptor 2) are not captured: a step that runs
as its own process (through iris) has all of its output kept instead.

The stream proxies are installed on first use and removed when the last capture in the process
ends, so nothing changes for code that runs outside steps.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from iris.attempt_log import AttemptLog

_routes: dict[int, AttemptLog] = {}  # thread ident -> the log its output also goes to
_lock = threading.Lock()
_installed: dict[str, Any] = {}


class _RoutingStream(io.TextIOBase):
    """Writes go to the original stream, and also to the log of the writing thread's step, if any."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def write(self, text: str) -> int:
        log = _routes.get(threading.get_ident())
        if log is not None and text:
            log.append(0, text.encode("utf-8", errors="replace"))
        return self.original.write(text)

    def flush(self) -> None:
        self.original.flush()

    def isatty(self) -> bool:
        return self.original.isatty()

    def fileno(self) -> int:
        return self.original.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.original, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


class _RoutingHandler(logging.Handler):
    """Log records of a step's thread, formatted like the terminal's, into its log.

    A record already written through a routed stream (a handler set up after the proxies were, that
    holds the proxy as its stream) is not written twice.
    """

    def emit(self, record: logging.LogRecord) -> None:
        log = _routes.get(record.thread or 0)
        if log is None or _logged_through_proxy():
            return
        try:
            log.append(0, (self.format(record) + "\n").encode("utf-8", errors="replace"))
        except Exception:  # noqa: BLE001 - a copy of the output must never break the step
            self.handleError(record)


def _logged_through_proxy() -> bool:
    return any(
        isinstance(handler, logging.StreamHandler) and isinstance(getattr(handler, "stream", None), _RoutingStream)
        for handler in logging.getLogger().handlers
    )


def _terminal_formatter() -> logging.Formatter:
    for handler in logging.getLogger().handlers:
        if handler.formatter is not None and not isinstance(handler, _RoutingHandler):
            return handler.formatter
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def _install() -> None:
    if _installed:
        return
    handler = _RoutingHandler()
    handler.setFormatter(_terminal_formatter())
    _installed.update(stdout=sys.stdout, stderr=sys.stderr, handler=handler)
    sys.stdout = _RoutingStream(sys.stdout)
    sys.stderr = _RoutingStream(sys.stderr)
    logging.getLogger().addHandler(handler)


def _uninstall() -> None:
    if not _installed:
        return
    # Only put back what is still ours: code may have replaced the streams meanwhile.
    if isinstance(sys.stdout, _RoutingStream):
        sys.stdout = _installed["stdout"]
    if isinstance(sys.stderr, _RoutingStream):
        sys.stderr = _installed["stderr"]
    logging.getLogger().removeHandler(_installed["handler"])
    _installed.clear()


@contextlib.contextmanager
def captured_into(log: AttemptLog | None) -> Iterator[None]:
    """Copy this thread's output into ``log`` for the block (no-op for ``None``); an exception that
    ends the block is written there with its traceback before it propagates."""
    if log is None:
        yield
        return
    ident = threading.get_ident()
    with _lock:
        _install()
        _routes[ident] = log
    try:
        yield
    except BaseException:
        log.append(0, traceback.format_exc().encode("utf-8", errors="replace"))
        raise
    finally:
        with _lock:
            _routes.pop(ident, None)
            if not _routes:
                _uninstall()
        log.flush()
