"""The base class of the errors marin raises on purpose (see :mod:`rigging.errors`), and how a
script shows one that nothing caught.

``marin run`` prints such an error as one line. A script run with plain ``python`` would print
Python's traceback instead, a dozen frames deep into the library for an error whose message
already says what to do. So importing marin installs :func:`explained_excepthook` (only where
Python's own hook is still in place: an IDE's or a notebook's is left alone): an uncaught
:class:`~rigging.errors.ExplainedError` prints one line, naming the script line that raised it;
``MARIN_TRACEBACK=1`` brings the whole traceback back. Any other exception is a bug and keeps its
traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

from rigging.errors import ExplainedError

TRACEBACK_VARIABLE = "MARIN_TRACEBACK"


class MarinError(ExplainedError):
    """Base of the errors raised by ``marin``: the engine, datasets, experiments, evaluation and reports."""


def explained_excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    if not isinstance(error, ExplainedError) or os.environ.get(TRACEBACK_VARIABLE):
        sys.__excepthook__(kind, error, tb)
        return
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    frames = [frame for frame in traceback.extract_tb(tb) if script and frame.filename == script]
    where = f"{frames[-1].filename}, line {frames[-1].lineno}: " if frames else ""
    print(f"{where}{kind.__name__}: {error} (the whole traceback: {TRACEBACK_VARIABLE}=1)", file=sys.stderr)


def install_explained_excepthook() -> None:
    """Make :func:`explained_excepthook` the process's hook, unless someone else's is in place."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = explained_excepthook
