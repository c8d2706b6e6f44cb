"""What a request can get wrong, each with the HTTP status the browser sees."""

from __future__ import annotations

from marin.errors import MarinError


class ServeError(MarinError):
    """A request the view cannot answer; ``status`` is the HTTP status of the error page."""

    status = 400
    title = "Bad request"


class PathOutsidePrefixError(ServeError, ValueError):
    status = 400
    title = "Path refused"


class NotFoundError(ServeError, FileNotFoundError):
    status = 404
    title = "Not found"


class UnreadableError(ServeError, ValueError):
    """A file exists but cannot be read as what it claims to be (damaged JSON, a bad shard...)."""

    status = 422
    title = "Unreadable file"
