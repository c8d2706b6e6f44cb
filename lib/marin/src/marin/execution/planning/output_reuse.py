"""When a step's existing output folder may be reused, and when it must be refused.

Identity. The status file records the full identity it is about. Before anything runs, and again
once a step's lease is held, every folder's recorded identity is compared with the step's: a
folder holding another identity's output (an explicit ``output_path`` reused by a changed
configuration, or two configurations whose 8-digit folder hashes collide) is refused
(:class:`OutputPathConflict`), naming both identities; a SUCCESS whose identity no record confirms
is refused too (:class:`UnverifiedOutputError`). The comparison, not a longer folder hash, is what
makes reuse safe: a longer hash only makes a collision rarer, the comparison makes it harmless.

Code drift. A step's function code is not part of its identity (see
:mod:`marin.execution.hashing.code_fingerprint`). A cached output made by other code is reused with a
warning, "code changed since this output was made"; under ``strict`` the run refuses it
(:class:`CodeChangedError`) before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from rigging.log import get_logger

from marin.errors import MarinError
from marin.execution.hashing.code_fingerprint import comparable
from marin.execution.records.executor_files import (
    STATUS_SUCCESS,
    StatusRecord,
    recorded_identity,
)
from marin.execution.step_spec import StepSpec

# The runner's log lines keep one logger name however its code is split, so log filters keep working.
logger = get_logger("marin.execution.step_runner")


class OutputPathConflict(MarinError, RuntimeError):
    """A step's output folder already holds the output of a step with another identity."""


class UnverifiedOutputError(OutputPathConflict):
    """A folder says SUCCESS but no record in it names the identity it is the output of."""


class CodeChangedError(MarinError, RuntimeError):
    """Under ``strict``, cached outputs that were made by other code than the steps' functions now."""


def check_recorded_identity(spec: StepSpec, output_path: str, status: StatusRecord | None) -> None:
    """Refuse a folder that holds another identity's output, or a SUCCESS no record ties to one."""
    recorded = recorded_identity(output_path, status)
    if recorded == spec.identity or (recorded is None and (status is None or status.status != STATUS_SUCCESS)):
        return
    if recorded is None:
        raise UnverifiedOutputError(
            f"Step {spec.name!r} ({spec.identity}): {output_path} says SUCCESS, but which configuration it is the "
            "output of cannot be confirmed: its .executor_status names no identity and its .executor_info is missing "
            "or unreadable. Refusing to reuse it. Delete that folder (e.g. `rm -r` it) to recompute it."
        )
    if spec.output_path is not None:
        why = "Its explicit output_path already holds the output of another configuration."
    else:
        why = (
            f"The two identities begin with the same {len(spec.short_hash)} hex digits, so their default folders "
            "collide (about one chance in four billion per pair); give this step a version= or an output_path."
        )
    raise OutputPathConflict(
        f"Step {spec.name!r} has identity {spec.short_hash} ({spec.identity}) but {output_path} holds the output of "
        f"identity {recorded[:8]} ({recorded}). {why} Refusing to reuse or overwrite it. Delete that folder to "
        "recompute there (e.g. `rm -r` it), or give the step another output_path; `marin explain` on the two "
        "shows what changed."
    )


def made_by_other_code(spec: StepSpec, status: StatusRecord) -> bool:
    """Whether the output ``status`` describes was made by code other than ``spec.fn`` now (when the two compare)."""
    current = spec.code_fingerprint
    return current is not None and comparable(status.code, current.digest) and status.code != current.digest


def report_changed_code(changed: Sequence[tuple[StepSpec, str]], *, strict: bool) -> None:
    """Say which cached outputs (``(spec, output_path)``) were made by other code; under ``strict``, refuse them."""
    for spec, output_path in changed:
        log = logger.error if strict else logger.warning
        log(
            "Step %s: code changed since this output was made (%s is not the code that wrote %s). %s",
            spec.name,
            spec.defined_at,
            output_path,
            "Refusing to reuse it (strict)." if strict else
            "Reusing it, because the identity is the same; bump the step's version to recompute, or use strict to refuse.",
        )
    if strict and changed:
        names = ", ".join(f"{spec.name} ({output_path})" for spec, output_path in changed)
        raise CodeChangedError(
            f"Strict run: {len(changed)} cached output(s) were made by other code than their step functions now: "
            f"{names}. Give each changed step a new version= (its outputs are then recomputed), delete those "
            "folders, or run without strict to reuse them."
        )
