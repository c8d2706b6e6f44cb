"""The roots of the project's exceptions.

Every package has one base class for the errors it raises on purpose (``RiggingError``,
``HaliaxError``, ``FrayError``, ``IrisError``, ``ZephyrError``, ``LevanterError``,
``MarinError``), each a kind of :class:`ExplainedError`. Such an error's message says what went
wrong and what to do about it, so whoever shows it to a person (the step runner, a command line)
shows the message and keeps the traceback for debugging; any other exception is a bug somewhere
and is shown with its traceback. Specific errors also keep the built-in class that says what kind
of problem they are (``class UnsafeNameError(RiggingError, ValueError)``), so ``except ValueError``
still catches a bad setting.
"""

from __future__ import annotations


class ExplainedError(Exception):
    """An error raised on purpose, whose message explains it (see the module docstring)."""


class RiggingError(ExplainedError):
    """Base of the errors raised by ``rigging``: configuration, file systems, leases, names."""
