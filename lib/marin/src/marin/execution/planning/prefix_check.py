"""Refusing, before any step starts, a prefix that can never hold step outputs.

Otherwise the first status read or write fails deep inside the runner, once per step. A local
prefix must be (or be creatable as) a folder, and for a real run one this process can write in;
a dry run writes nothing, so it only checks that the prefix is not inside a file. An object
store is checked for the conditional writes that leases need, not probed: its permissions show
on the first write. The error names where the prefix was set, so the user knows what to change.
"""

from __future__ import annotations

import os
import tempfile

from rigging import conditional_writes
from rigging import filesystem as fsx

from marin.execution.records.executor_files import LOCK_FILE
from marin.execution.planning.run_defaults import RunOptionError


class PrefixNotWritableError(RunOptionError):
    """The output prefix is a local path where step outputs cannot be written."""


def check_prefix(prefix: str, source: str, *, writing: bool) -> None:
    """Raise :class:`PrefixNotWritableError` if ``prefix`` (set by ``source``, see
    :meth:`rigging.config.discovery.MarinConfig.source_of`) can never hold outputs;
    ``writing``: a run that writes, not a dry run."""
    if not fsx.is_local(prefix):
        if writing:
            try:
                conditional_writes.check_conditional_writes(fsx.join(prefix, LOCK_FILE))
            except conditional_writes.ConditionalWritesUnsupportedError as exc:
                raise PrefixNotWritableError(
                    f"Steps cannot run under the prefix {prefix}, set by "
                    f"{_describe_prefix_source(source)}: each running step holds a lease there, "
                    f"and {exc.protocol}:// cannot hold one safely ({exc.missing}). Use local disk, s3:// or gs://."
                ) from None
        return
    path = prefix.removeprefix("file://")
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    problem = None
    if not os.path.isdir(existing):
        problem = f"{existing} is a file, not a folder" if existing == path else f"{existing} is a file, so no folder can be made under it"
    elif writing:
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.TemporaryFile(dir=path, prefix=".marin-write-check-"):
                pass
        except OSError as exc:
            problem = f"{exc.strerror or exc} ({exc.filename or path})"
    if problem:
        raise PrefixNotWritableError(
            f"Step outputs cannot be written under the prefix {prefix}, set by "
            f"{_describe_prefix_source(source)}: {problem}. Point the prefix at a folder you can "
            "write: `export MARIN_PREFIX=$HOME/marin-outputs`, `marin run --prefix DIR`, StepRunner(prefix=DIR), "
            "or `prefix: DIR` in marin.yaml."
        )


def _describe_prefix_source(source: str) -> str:
    if source == "argument":
        return "the prefix argument (or marin run --prefix)"
    if source.startswith("env:"):
        return f"the environment variable {source[4:]}"
    if source == "default":
        return "the default"
    return f"the prefix setting in {source}"
