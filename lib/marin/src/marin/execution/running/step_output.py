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

A step may print a line at a time for hours, so its output is gathered in memory and handed to the
log in chunks: when :data:`CHUNK_CHARS` have gathered, when the step flushes the stream
(``print(..., flush=True)``), every :data:`FLUSH_INTERVAL_S` seconds, and when the step ends
(returns, raises or is cancelled). The log is therefore whole when the step ends and at most that
interval behind while it runs; a runner killed outright loses what it printed in its last interval
and did not flush.
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
from rigging.log import get_logger

logger = get_logger(__name__)

FLUSH_INTERVAL_S = 0.5  # how far a running step's log may lag what it printed
CHUNK_CHARS = 64 * 1024  # gathered output is handed over at once when it reaches this size


class _Capture:
    """One step thread's output on its way into its log: gathered, then handed over in chunks
    (see the module's comment for when). Handing over happens under a lock, so the chunks reach the
    log in the order they were written, and only through :meth:`AttemptLog.append`, whose redaction
    holds back the start of a secret until the next chunk shows whether it is one."""

    def __init__(self, log: AttemptLog) -> None:
        self.log = log
        self._pending: list[str] = []
        self._size = 0
        self._lock = threading.Lock()
        self._ended = threading.Event()
        # Started with the first output: a step that prints nothing (most small steps of a large
        # graph) costs no thread.
        self._ticker: threading.Thread | None = None

    def add(self, text: str) -> None:
        with self._lock:
            if self._ticker is None and not self._ended.is_set():
                self._ticker = threading.Thread(target=self._hand_over_every_interval, name="step-output-flush", daemon=True)
                self._ticker.start()
            self._pending.append(text)
            self._size += len(text)
            if self._size >= CHUNK_CHARS:
                self._hand_over()

    def hand_over(self) -> None:
        with self._lock:
            self._hand_over()

    def end(self) -> None:
        with self._lock:
            self._ended.set()
            ticker = self._ticker
        if ticker is not None:
            ticker.join()
        self.hand_over()

    def _hand_over(self) -> None:
        if not self._pending:
            return
        text, self._pending, self._size = "".join(self._pending), [], 0
        self.log.append(0, text.encode("utf-8", errors="replace"))

    def _hand_over_every_interval(self) -> None:
        while not self._ended.wait(FLUSH_INTERVAL_S):
            try:
                self.hand_over()
            except Exception:  # noqa: BLE001 - a write the step's own thread makes later raises there
                logger.warning("Cannot keep a step's output in %s: what it printed in the last %.1fs is not in its "
                               "log", self.log.url, FLUSH_INTERVAL_S, exc_info=True)
                return


_routes: dict[int, _Capture] = {}  # thread ident -> where its output also goes
_lock = threading.Lock()
_installed: dict[str, Any] = {}


class _RoutingStream(io.TextIOBase):
    """Writes go to the original stream, and also to the log of the writing thread's step, if any."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def write(self, text: str) -> int:
        capture = _routes.get(threading.get_ident())
        if capture is not None and text:
            capture.add(text)
        return self.original.write(text)

    def flush(self) -> None:
        capture = _routes.get(threading.get_ident())
        if capture is not None:
            capture.hand_over()  # a step that flushes wants its output kept now
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
        capture = _routes.get(record.thread or 0)
        if capture is None or _logged_through_proxy():
            return
        try:
            capture.add(self.format(record) + "\n")
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
    capture = _Capture(log)
    with _lock:
        _install()
        _routes[ident] = capture
    try:
        yield
    except BaseException:
        capture.add(traceback.format_exc())  # after what the step printed, not before what is still gathered
        raise
    finally:
        with _lock:
            _routes.pop(ident, None)
            if not _routes:
                _uninstall()
        capture.end()
        log.flush()
