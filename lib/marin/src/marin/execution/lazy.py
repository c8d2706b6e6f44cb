"""Lazy handles: what library helpers (``tokenized()``, ``train_lm()``, ...) return.

A handle describes a step without running anything: it *is* a :class:`StepSpec` (``LazyStep``
is another name for that class), built by :func:`lazy_step`, whose function always receives a
:class:`~marin.execution.running.step_context.StepContext`, whatever its signature (the function is
marked :class:`~marin.execution.step_spec.takes_context`). So a handle's identity is the identity
of the step that runs, handles compose (a handle's ``deps`` are handles), can be dictionary keys,
and a step can look up a dependency by its handle: ``ctx.load_artifact(handle)``.

:func:`lower` lists handles with every transitive dependency, each once, in dependency order;
``StepRunner().run`` does the same itself, so ``run([handle])`` and ``run([lower(handle)])`` are
one run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from marin.execution.planning.step_graph import (
    StepGraphError,
    collect_steps,
    flatten_steps,
    topological_order,
)
from marin.execution.step_spec import StepSpec, takes_context

# A handle is a step; the name says which kind of value a helper returns.
LazyStep = StepSpec


def lazy_step(
    name: str,
    fn: Callable[..., Any],
    *,
    deps: Iterable[StepSpec] = (),
    hash_attrs: Mapping[str, Any] | None = None,
    version: str | None = None,
    resources: Any = None,
    output_path: str | None = None,
    annotations: Mapping[str, Any] | None = None,
) -> StepSpec:
    """A handle: the step ``name`` whose ``fn(ctx)`` runs only once a runner runs it."""
    return StepSpec(
        name=name,
        fn=takes_context(fn),
        deps=tuple(deps),
        hash_attrs=dict(hash_attrs or {}),
        version=None if version is None else str(version),
        resources=resources,
        output_path=output_path,
        annotations=dict(annotations or {}),
    )


def lower(*handles: StepSpec | Iterable[StepSpec]) -> list[StepSpec]:
    """``handles`` and all their transitive dependencies, each identity once, dependencies first.

    Accepts handles (or any steps) and (nested) iterables of them. Two handles with one identity
    are one step; two that would run different functions under one identity are refused
    (:class:`StepGraphError`).
    """
    return collect_steps(flatten_steps(handles, taker="lower()"))


__all__ = ["LazyStep", "StepGraphError", "lazy_step", "lower", "topological_order"]
