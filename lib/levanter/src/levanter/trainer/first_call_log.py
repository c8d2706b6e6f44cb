"""Say when a jitted function is being compiled, and how long that took.

The first call of a jitted step traces and compiles it (or reads it from the compilation cache)
before it returns, which on a small CPU can take a minute with nothing in the log. A
:class:`FirstCallLogged` function logs a line before its first call and one after it with the time
taken; later calls go straight through. It only logs: arguments, results and the wrapped
function's attributes (``lower``, ...) are the wrapped function's own.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

logger = logging.getLogger("levanter.trainer")


class FirstCallLogged:
    def __init__(self, fn: Callable[..., Any], what: str):
        self._fn = fn
        self._what = what
        self._lock = threading.Lock()
        self._called = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._called:
            return self._fn(*args, **kwargs)
        with self._lock:
            if self._called:
                return self._fn(*args, **kwargs)
            logger.info("Compiling %s (or reading it from the compilation cache)...", self._what)
            started = time.monotonic()
            result = self._fn(*args, **kwargs)
            self._called = True
            logger.info("Compiled %s in %.1fs.", self._what, time.monotonic() - started)
            return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


__all__ = ["FirstCallLogged"]
