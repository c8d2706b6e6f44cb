"""What goes wrong with a checkpoint: the error classes, and what a storage error means.

Orbax and TensorStore report every failure as some exception several layers deep. The checkpoint
code needs three answers from it: is the checkpoint's data damaged (set it aside), was the storage
only out of reach (leave it in place and say so), or is the disk full (say that, not the writer
thread's traceback)? :func:`is_passing_trouble` and :func:`is_disk_full` answer the last two;
anything else a reader raises means damaged files. :func:`root_cause` gives the one sentence of
the chain worth showing a user.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator, Mapping

import jax

from levanter.errors import LevanterError


class CheckpointError(LevanterError, RuntimeError):
    """A checkpoint that cannot be read back into this run's state."""


class UnreadableCheckpointError(CheckpointError):
    """A committed checkpoint whose files are damaged: missing, truncated or unparsable."""


class CheckpointDiskFullError(CheckpointError):
    """A checkpoint could not be written because its disk (or quota) is full."""


class CheckpointMismatchError(CheckpointError):
    """Another run's checkpoint whose arrays differ from this run's (``stored``: what it holds)."""

    def __init__(self, message: str, stored: Mapping[str, jax.ShapeDtypeStruct]):
        super().__init__(message)
        self.stored = dict(stored)


# TensorStore prefixes its errors with a status code. These say the storage could not be reached
# or the machine ran out of something, not that the files are bad: such a checkpoint stays put.
_PASSING_TROUBLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED",
                    "CANCELLED", "ABORTED")
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from, outermost first (as a traceback shows them)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def root_cause(error: BaseException) -> str:
    """The innermost error of ``error``'s chain as one short line."""
    # The outer errors of Orbax's reader repeat a whole TensorStore spec; the innermost one is the
    # sentence that says what is wrong with which file (TensorStore's carry a status code first).
    innermost = list(_causes(error))[-1]
    text = " ".join(str(innermost).split()).split(" [tensorstore_spec=")[0]
    if not re.match(r"[A-Z_]+: ", text):
        text = f"{type(innermost).__name__}: {text}" if text else type(innermost).__name__
    return text if len(text) <= 400 else text[:400] + "..."


def is_passing_trouble(error: BaseException) -> bool:
    """Whether ``error`` says the storage was out of reach (or the machine short of something), not the files bad."""
    for cause in _causes(error):
        if isinstance(cause, (PermissionError, ConnectionError, TimeoutError, MemoryError)):
            return True
        if str(cause).startswith(_PASSING_TROUBLE):
            return True
    return False


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) is a full disk or quota."""
    for cause in _causes(error):
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL_ERRNOS:
            return True
        # TensorStore's array writes report the OS error in the text: "... [os_error_code='28']".
        text = str(cause)
        if any(os.strerror(code) in text or f"os_error_code='{code}'" in text for code in _DISK_FULL_ERRNOS):
            return True
    return False
