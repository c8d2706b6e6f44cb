"""Extraction of a page's main text, in a process of its own whose CPU time per page the kernel limits.

What extraction costs depends on markup no linear scan fully models: a page of 100,000 ``<div/>``
(an HTML parser opens each one, whatever the slash says) took 308 s, and the extractors are calls
into C (resiliparse) or long passes of Python (trafilatura) that no thread or signal handler can
interrupt. So :func:`extract_within` sends each page to a child process which, before extracting
it, arms a CPU-time timer (``ITIMER_PROF``: user and system time of that process) whose signal,
left at its default action, ends the process once the page's budget is spent. The parent finds the
child gone, reports the page as past the limit, and starts a fresh child for the next page. The
bound is the kernel's, whatever the markup, and a busy machine (wall time) does not count against
a page; a child that stalls without using CPU is stopped after ``_WALL_FACTOR`` times the budget.

Each thread of a process has one child, started on first use (about 0.1 s, once) and ended with
the thread or the process; a page costs a round trip through two pipes
(``bench/extraction_guards.py`` prints it beside extraction itself).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import IO

from marin.errors import MarinError

logger = logging.getLogger(__name__)

_EXTRACTORS = ("resiliparse", "trafilatura")
_REQUEST = struct.Struct("<dBI")  # CPU budget in seconds, extractor, bytes of HTML that follow
_REPLY = struct.Struct("<BI")  # 0 and the text, or 1 and the error, in bytes that follow
_WALL_FACTOR = 60


class ExtractionProcessError(MarinError):
    """Extraction failed in its process (an exception there, or the process ended by something other
    than the page's CPU limit); the message names the page."""


def _extractor(extractor: str) -> Callable[[str], str]:
    """The extractor's function, imported (so importing is never counted against a page)."""
    if extractor == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text

        return lambda html: extract_plain_text(html, main_content=True, alt_texts=False, links=False, list_bullets=True)
    if extractor == "trafilatura":
        import trafilatura

        return lambda html: trafilatura.extract(html, include_comments=False, include_tables=True,
                                                favor_precision=False) or ""
    raise ValueError(f"extractor must be 'resiliparse' or 'trafilatura', not {extractor!r}")


def extract_text(html: str, extractor: str = "resiliparse") -> str:
    """The main text of an HTML page, extracted in this process without a limit; paragraphs separated by newlines."""
    lines = [line.strip() for line in _extractor(extractor)(html).split("\n")]
    return "\n".join(line for line in lines if line)


def extract_within(html: str, extractor: str, cpu_limit_s: float, page: str) -> str | None:
    """:func:`extract_text` in this thread's extraction process; None when the page spent ``cpu_limit_s``
    of CPU there (or ``_WALL_FACTOR`` times that in wall time) and was stopped. ``page`` names it in errors."""
    if extractor not in _EXTRACTORS:
        raise ValueError(f"extractor must be 'resiliparse' or 'trafilatura', not {extractor!r}")
    if not cpu_limit_s > 0:
        raise ValueError(f"the CPU limit per page must be above 0 s, not {cpu_limit_s!r}")
    child = getattr(_local, "child", None)
    if child is None or not child.usable():
        child = _local.child = _Child()
    return child.extract(html, extractor, cpu_limit_s, page)


_local = threading.local()


class _Child:
    """One extraction process and the pipes to it (owned by one thread of one process)."""

    def __init__(self):
        self.parent_pid = os.getpid()
        # the child imports marin as this process does, wherever it was found
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        self.process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env)
        weakref.finalize(self, _stop, self.process, self.parent_pid)

    def usable(self) -> bool:
        return self.parent_pid == os.getpid() and self.process.poll() is None  # not inherited by a fork, not ended

    def extract(self, html: str, extractor: str, cpu_limit_s: float, page: str) -> str | None:
        try:
            return self._round_trip(html, extractor, cpu_limit_s, page)
        except BaseException:
            # a reply may still be on its way (Ctrl-C while waiting): the next page must not read it
            self.process.kill()
            self.process.wait()
            raise

    def _round_trip(self, html: str, extractor: str, cpu_limit_s: float, page: str) -> str | None:
        requests, replies = self.process.stdin, self.process.stdout
        assert requests is not None and replies is not None
        data = html.encode("utf-8", "surrogatepass")
        try:
            requests.write(_REQUEST.pack(cpu_limit_s, _EXTRACTORS.index(extractor), len(data)) + data)
            requests.flush()
        except BrokenPipeError:
            return self._ended(page)
        waiting = select.poll()
        waiting.register(replies, select.POLLIN)
        if not waiting.poll(_WALL_FACTOR * cpu_limit_s * 1000):
            # alive but not finishing: never seen, but a shard must not wait on it forever
            logger.warning("%s: extraction used less than its CPU limit but ran %g s; stopped", page,
                           _WALL_FACTOR * cpu_limit_s)
            self.process.kill()
            self.process.wait()
            return None
        header = _read(replies, _REPLY.size)
        if header is None:
            return self._ended(page)
        status, size = _REPLY.unpack(header)
        body = _read(replies, size)
        if body is None:
            return self._ended(page)
        text = body.decode("utf-8", "surrogatepass")
        if status:
            raise ExtractionProcessError(f"{page}: extraction failed: {text}")
        return text

    def _ended(self, page: str) -> None:
        """The process is gone: None when its CPU limit ended it, an error otherwise."""
        code = self.process.wait()
        if code == -signal.SIGPROF:
            return None
        raise ExtractionProcessError(f"{page}: the extraction process ended with exit status {code} during this page")


def _read(stream: IO[bytes], size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def _stop(process: subprocess.Popen, parent_pid: int) -> None:
    """End a child whose thread or process is done with it: closing its input ends its loop."""
    if os.getpid() != parent_pid:
        return  # a forked copy of the owner: the child is not this process's to end
    try:
        process.stdin.close()  # type: ignore[union-attr]
        process.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()
        process.wait()


def _serve() -> None:
    """The child: extract each page sent on stdin within its CPU budget; reply on stdout."""
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # the budget's end ends this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes our input
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the replies
    while True:
        header = _read(requests, _REQUEST.size)
        if header is None:
            return  # the parent is done (or gone)
        cpu_limit_s, which, size = _REQUEST.unpack(header)
        html = (_read(requests, size) or b"").decode("utf-8", "surrogatepass")
        extractor = _EXTRACTORS[which]
        _extractor(extractor)  # imported before the clock starts
        signal.setitimer(signal.ITIMER_PROF, cpu_limit_s)
        try:
            status, reply = 0, extract_text(html, extractor)
        except Exception as error:  # noqa: BLE001 - sent back to the parent, which raises it for the page
            status, reply = 1, f"{type(error).__name__}: {error}"
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        data = reply.encode("utf-8", "surrogatepass")
        replies.write(_REPLY.pack(status, len(data)) + data)
        replies.flush()


if __name__ == "__main__":
    _serve()
