"""How a failed step is shown: the message when it says what to do, otherwise the step's traceback.

Errors the project's packages raise on purpose (each package's base class, ``MarinError``,
``LevanterError``, ..., is an :class:`~rigging.errors.ExplainedError`) carry a message that says
what to do (a bad setting, a missing file); for them the traceback only buries the message, so the
log shows the message and the line of the user's own code that led there, and keeps the traceback
at DEBUG. Any other error shows its traceback once, starting at the step's function: the engine's
own frames above it are left out.
"""

from __future__ import annotations

import os
import sysconfig
import traceback

from rigging.errors import ExplainedError
from rigging.log import get_logger

# The runner's log lines keep one logger name however its code is split, so log filters keep working.
logger = get_logger("marin.execution.step_runner")

# Frames of these packages are never "the user's own code".
_PROJECT_PACKAGES = frozenset({"rigging", "storygen", "haliax", "fray", "iris", "zephyr", "levanter", "marin"})

# Between the runner's worker thread and a step's function there are only frames of the engine
# (the step attempt, the step executor, takes_context): files in marin/execution and its subfolders.
_ENGINE_FOLDER = os.path.dirname(os.path.dirname(__file__)) + os.sep


def is_explained_error(exc: BaseException) -> bool:
    """Whether ``exc`` was raised on purpose with a message that explains it (decided by its type)."""
    return isinstance(exc, ExplainedError)


def user_frame(exc: BaseException) -> str:
    """`` (in FUNC at FILE:LINE)`` for the deepest frame of the user's own code, or ``""``.

    A message-only error raised by a library call still points at the line that made the call.
    """
    found = ""
    paths = sysconfig.get_paths()
    library_paths = tuple({paths["stdlib"], paths["purelib"], paths["platlib"]})
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        module = str(tb.tb_frame.f_globals.get("__name__", "")).split(".", 1)[0]
        if module not in _PROJECT_PACKAGES and not code.co_filename.startswith(library_paths):
            found = f" (in {code.co_name} at {code.co_filename}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found


def step_traceback(exc: BaseException) -> str:
    """The traceback from the step function down, without the engine's own frames above it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_ENGINE_FOLDER):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def log_step_failure(name: str, output_path: str, message: str, exc: BaseException, *, message_only: bool) -> None:
    """Log the failure of step ``name`` once: ``message`` alone (``message_only``, or an explained
    error), else with the step's traceback."""
    if message_only or is_explained_error(exc):
        # The message says what to do (or the run's own stop request is the cause); the traceback
        # is there for whoever wants it.
        logger.error("Step %s failed (output folder %s): %s%s", name, output_path, message, user_frame(exc))
        logger.debug("Traceback of step %s:\n%s", name, step_traceback(exc))
    else:
        logger.error("Step %s failed (output folder %s):\n%s", name, output_path, step_traceback(exc).rstrip())
