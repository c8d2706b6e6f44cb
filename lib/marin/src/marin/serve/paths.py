"""Paths in URLs are relative to the prefix and can never leave it.

A requested path is normalised segment by segment: empty and ``.`` segments are dropped; ``..``,
absolute paths, home-relative paths, URLs or protocol strings (anything with ``:``), backslashes
and control characters are refused outright rather than "fixed", so a link either means what it
says or gives an error. On local disk a path is also refused when the place it resolves to, symbolic
links followed, lies outside the prefix (a link in the prefix to ``/etc`` must not serve ``/etc``);
object stores have no links.
"""

from __future__ import annotations

from rigging import filesystem as fsx
from rigging.regular_files import stays_within

from marin.serve.errors import PathOutsidePrefixError


def clean_relative(path: str | None) -> str:
    """``path`` normalised to ``a/b/c`` (``""`` for the prefix itself), or :class:`PathOutsidePrefixError`."""
    if path is None:
        return ""
    if any(ord(ch) < 32 for ch in path) or "\\" in path or ":" in path:
        raise PathOutsidePrefixError(f"path {path!r} is refused: only plain paths relative to the prefix are served")
    if path.startswith(("/", "~")):
        raise PathOutsidePrefixError(f"path {path!r} is refused: absolute paths are not served, give it relative to the prefix")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PathOutsidePrefixError(f"path {path!r} is refused: '..' would leave the prefix")
    return "/".join(parts)


def resolve(prefix: str, path: str | None) -> str:
    """The URL of ``path`` (relative, checked) under ``prefix``, which it does not leave through a link."""
    relative = clean_relative(path)
    if not relative:
        return prefix.rstrip("/")
    url = fsx.join(prefix, relative)
    if not stays_within(prefix, url):
        raise PathOutsidePrefixError(f"path {path!r} is refused: it is a link to a place outside the prefix")
    return url


def relative_to(prefix: str, url: str) -> str | None:
    """``url`` relative to ``prefix``, or ``None`` when it lies elsewhere."""
    root = prefix.rstrip("/")
    if url.rstrip("/") == root:
        return ""
    if url.startswith(root + "/"):
        return url[len(root) + 1 :].strip("/")
    return None
