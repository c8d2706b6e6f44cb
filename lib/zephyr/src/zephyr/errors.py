"""zephyr's errors: its base class, and the problems a user can cause with the data they point zephyr at."""

from __future__ import annotations

from rigging.errors import ExplainedError


class ZephyrError(ExplainedError):
    """Base of the errors raised by ``zephyr`` (see :mod:`rigging.errors`)."""


class InputError(ZephyrError, ValueError):
    """Base class of problems with input data a user pointed a reader at."""


class InputFileError(InputError):
    """A file that cannot be read as the documents it should hold; names the file (and line)."""

    def __init__(self, path: str, problem: str, line: int | None = None):
        self.path = path
        self.line = line
        self.problem = problem
        where = f"{path}, line {line}" if line is not None else path
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):  # keeps the fields (and notes) when sent back from a worker process
        return (type(self), (self.path, self.problem, self.line), self.__dict__)


class InputNotFoundError(InputError, FileNotFoundError):
    """A path, folder or pattern that matches no file."""


class UnsupportedInputError(InputError):
    """A file whose extension names no format zephyr reads."""


class HubDatasetUnavailableError(InputError):
    """A Hugging Face dataset id that is neither in the local cache nor downloadable now."""
