"""What a running step sees: its output path, its own spec, and its dependencies' outputs."""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rigging.lease import LeaseLostError

from marin.errors import MarinError
from marin.execution.artifact import Artifact, load_artifact
from marin.execution.hashing.identity import InvalidStepError
from marin.execution.ownership.interrupts import Interrupt, interrupt_of
from marin.execution.ownership.resumable_state import declare_resumable
from marin.execution.step_spec import StepSpec


class RunCancelled(MarinError, RuntimeError):
    """The runner was interrupted (Ctrl-C or SIGTERM) and asks running steps to stop."""


class StopReason(enum.Enum):
    """Why a running step should stop; see :meth:`StepContext.stop_reason`."""

    LEASE_LOST = "lease lost"  # another runner may own the output now: write nothing more
    INTERRUPTED = "interrupted"  # Ctrl-C: stop soon, saving what lets a rerun resume
    PREEMPTED = "preempted"  # SIGTERM: the same, and the machine is going away


@dataclass(frozen=True)
class StepContext:
    """Passed to step functions that ask for it (see :mod:`marin.execution.step_spec`).

    ``dep_output_paths`` maps each dependency's identity to where its output lives in this run.
    Long-running steps should call :meth:`check_lease` now and then (for example once per training
    step) so they stop promptly if another runner took the step over or the run was interrupted.
    Steps that can save progress ask :meth:`stop_reason` instead, to save first when that is allowed.
    """

    output_path: str
    step: StepSpec
    dep_output_paths: Mapping[str, str] = field(default_factory=dict)
    lease_lost: threading.Event = field(default_factory=threading.Event, repr=False)
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def _resolve(self, dep: Any) -> StepSpec:
        if isinstance(dep, str):
            matches = [d for d in self.step.deps if d.name == dep]
            if not matches:
                raise InvalidStepError(
                    f"Step {self.step.name!r} has no dependency named {dep!r}; its deps are {[d.name for d in self.step.deps]}."
                )
            if len(matches) > 1:
                raise InvalidStepError(
                    f"Step {self.step.name!r} has {len(matches)} dependencies named {dep!r}; pass the step or handle itself."
                )
            return matches[0]
        identity = getattr(dep, "identity", None)
        for candidate in self.step.deps:
            if candidate.identity == identity:
                return candidate
        raise InvalidStepError(
            f"{getattr(dep, 'name', dep)!r} is not a dependency of step {self.step.name!r}; add it to the step's deps "
            "so it runs first and counts towards this step's identity."
        )

    def dep_output_path(self, dep: Any) -> str:
        """Output path of ``dep`` (a StepSpec, a lazy handle, or a dependency's name)."""
        spec = self._resolve(dep)
        return self.dep_output_paths[spec.identity]

    def load_artifact(self, dep: Any, cls: Any = None) -> Artifact:
        """The :class:`~marin.execution.artifact.Artifact` that ``dep`` saved (result rebuilt as ``cls``)."""
        return load_artifact(self.dep_output_path(dep), cls)

    def declare_resumable(self, *names: str) -> None:
        """Say that the entries ``names`` of the output (paths relative to ``output_path``) are state
        this step continues from, and reconciles itself, when it runs again after stopping short: a
        later execution or attempt takes them over (with every checkpoint and finished token-cache
        shard, which carry their own checksums); anything else a stopped execution left is not
        continued in (see :mod:`marin.execution.ownership.resumable_state`)."""
        declare_resumable(self.output_path, list(names))

    @property
    def lost_lease(self) -> bool:
        return self.lease_lost.is_set()

    def stop_reason(self) -> StopReason | None:
        """Whether this step should stop now, and why; None to carry on. Cheap enough for every step.

        A lost lease comes first: a step that lost it must not write even a checkpoint, whatever
        else happened. With Ctrl-C or SIGTERM a step may save what lets a rerun resume, then stop.
        """
        if self.lease_lost.is_set():
            return StopReason.LEASE_LOST
        interrupt = interrupt_of(self.cancelled)
        if interrupt is None:
            return None
        return StopReason.PREEMPTED if interrupt is Interrupt.SIGTERM else StopReason.INTERRUPTED

    def check_lease(self) -> None:
        """Raise if another runner took this step over, or the run was interrupted (Ctrl-C, SIGTERM).

        Raises :class:`LeaseLostError` or :class:`RunCancelled`.
        """
        interrupt = interrupt_of(self.cancelled)
        if interrupt is not None:
            how = "interrupted (Ctrl-C)" if interrupt is Interrupt.CTRL_C else "preempted (SIGTERM)"
            raise RunCancelled(f"The run was {how}; step {self.step.name!r} stops here.")
        if self.lease_lost.is_set():
            raise LeaseLostError(
                f"Step {self.step.name!r} lost its lease on {self.output_path}; stopping so two runners do not both write it."
            )
