"""Names that become folders: step names, job names. One rule for all of them.

A name is a relative path of ``/``-separated segments, each of letters, digits, ``.``, ``_`` and
``-`` that does not start with ``.``. So a name can never climb out of the folder it is placed in
(no ``..``, no absolute path, no URL), never hides (no leading ``.``: listings skip such folders and
tools keep their own files there), survives a shell and a URL unquoted, and fits in one file-system
path component (255 bytes) with room for the suffix callers add (a hash, a timestamp).
"""

from __future__ import annotations

import re

from rigging.errors import RiggingError

MAX_SEGMENT_LENGTH = 200
MAX_NAME_LENGTH = 1000
_FIRST, _REST = r"[A-Za-z0-9_\-]", r"[A-Za-z0-9_.\-]"  # a segment's first character, and the others
_SEGMENT = re.compile(f"{_FIRST}{_REST}*")
# Every rule below at once, for the common case of a good name (a sweep declares thousands).
_BOUNDED_SEGMENT = f"{_FIRST}{_REST}{{0,{MAX_SEGMENT_LENGTH - 1}}}"
_GOOD_NAME = re.compile(f"{_BOUNDED_SEGMENT}(?:/{_BOUNDED_SEGMENT})*")
_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafeNameError(RiggingError, ValueError):
    """A name that cannot safely become a folder under another one."""


def check_relative_name(name: object, *, what: str = "Name", example: str = "checkpoints/my-model") -> str:
    """Return ``name`` if it is a safe relative folder name, else raise :class:`UnsafeNameError`.

    ``what`` starts each message (``"Step name"``, ``"Job name"``) and ``example`` shows a good one.
    """
    if not isinstance(name, str) or not name:
        raise UnsafeNameError(f"{what} must be a non-empty string, got {name!r}.")
    if len(name) <= MAX_NAME_LENGTH and _GOOD_NAME.fullmatch(name):
        return name
    if name.startswith(("/", "\\")) or "://" in name or _DRIVE.match(name):
        raise UnsafeNameError(f"{what} {name!r} is an absolute path or URL; names are relative, like {example!r}.")
    if len(name) > MAX_NAME_LENGTH:
        raise UnsafeNameError(f"{what} {name[:40]!r}... is {len(name)} characters long; keep it under {MAX_NAME_LENGTH}.")
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            raise UnsafeNameError(f"{what} {name!r} has an empty, '.' or '..' path segment; use names like {example!r}.")
        if segment.startswith("."):
            raise UnsafeNameError(
                f"{what} {name!r} has the segment {segment!r} starting with '.'; such folders are hidden. "
                "Start it with a letter or digit."
            )
        if not _SEGMENT.fullmatch(segment):
            raise UnsafeNameError(
                f"{what} {name!r} contains characters unsafe in paths; use only letters, digits, '.', '_', '-' and '/'."
            )
        if len(segment) > MAX_SEGMENT_LENGTH:
            raise UnsafeNameError(
                f"{what} {name[:40]!r}... has a segment of {len(segment)} characters; file systems refuse folder "
                f"names that long. Keep each '/'-separated part under {MAX_SEGMENT_LENGTH} characters."
            )
    return name


def safe_name_from(text: str, *, fallback: str = "job") -> str:
    """A one-segment name made from free text (a command's file name): unsafe runs become ``-``."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]+", "-", text).strip(".-")[:MAX_SEGMENT_LENGTH]
    return cleaned or fallback
