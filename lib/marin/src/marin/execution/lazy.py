"""Lazy handles: what library helpers (``tokenized()``, ``train_lm()``, ...) return.

A :class:`LazyStep` describes a step without running anything. Handles compose (a handle's
``deps`` are handles), can be dictionary keys, and turn into :class:`StepSpec`s with
:func:`lower`, which also collects every transitive dependency once, in dependency order. A
handle's :attr:`~LazyStep.identity` equals the identity of the spec it lowers to, so a step can
look up a dependency by its handle: ``ctx.load_artifact(handle)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from marin.execution.code_fingerprint import fingerprint_function
from marin.execution.identity import (
    IdentifiedStep,
    InvalidStepError,
    canonicalize,
    identity_hash,
    identity_record,
    validate_step_name,
)
from marin.execution.step_spec import StepSpec, takes_context


class StepGraphError(ValueError):
    """A dependency graph that cannot run: a cycle, or two different steps sharing an identity/output."""


@dataclass(frozen=True, eq=False, repr=False)
class LazyStep(IdentifiedStep):
    """A step not yet lowered. ``fn`` always receives a :class:`StepContext`."""

    name: str
    fn: Callable[..., Any]
    deps: tuple["LazyStep", ...] = ()
    hash_attrs: Mapping[str, Any] = field(default_factory=dict)
    version: str | None = None
    resources: Any = None
    output_path: str | None = None

    def __post_init__(self) -> None:
        validate_step_name(self.name)
        object.__setattr__(self, "deps", tuple(self.deps or ()))
        if self.hash_attrs is None:
            object.__setattr__(self, "hash_attrs", {})
        for dep in self.deps:
            if not isinstance(dep, LazyStep):
                raise InvalidStepError(f"Lazy step {self.name!r} has a dependency of type {type(dep).__name__}; deps must be LazySteps.")
        if not callable(self.fn):
            raise InvalidStepError(f"Lazy step {self.name!r}: fn must be callable, got {self.fn!r}.")
        canonicalize(self.hash_attrs, where=f"{self.name}.hash_attrs")

    @cached_property
    def identity(self) -> str:
        return identity_hash(identity_record(self.name, self.version, self.hash_attrs, (d.identity for d in self.deps)))


def lazy_step(
    name: str,
    fn: Callable[..., Any],
    *,
    deps: Iterable[LazyStep] = (),
    hash_attrs: Mapping[str, Any] | None = None,
    version: str | None = None,
    resources: Any = None,
    output_path: str | None = None,
) -> LazyStep:
    """Build a :class:`LazyStep`; ``fn(ctx)`` runs only after :func:`lower` and a runner."""
    return LazyStep(
        name=name,
        fn=fn,
        deps=tuple(deps),
        hash_attrs=dict(hash_attrs or {}),
        version=None if version is None else str(version),
        resources=resources,
        output_path=output_path,
    )


def topological_order(roots: Iterable[Any]) -> list[Any]:
    """Every node reachable from ``roots`` through ``.deps``, dependencies first, each once.

    Nodes are tracked by object id, so this works before any identity is computed (an identity
    of a cyclic graph would never finish). Raises :class:`StepGraphError` naming a cycle.
    """
    order: list[Any] = []
    state: dict[int, int] = {}  # 1 = on the current path, 2 = done
    for root in roots:
        if state.get(id(root)) == 2:
            continue
        # Iterative depth-first search: deep chains (thousands of steps) must not hit the recursion limit.
        path: list[Any] = [root]
        iterators = [iter(root.deps)]
        state[id(root)] = 1
        while iterators:
            child = next(iterators[-1], None)
            if child is None:
                node = path.pop()
                iterators.pop()
                state[id(node)] = 2
                order.append(node)
                continue
            child_state = state.get(id(child))
            if child_state == 2:
                continue
            if child_state == 1:
                start = next(i for i, n in enumerate(path) if n is child)
                cycle = " -> ".join(n.name for n in [*path[start:], child])
                raise StepGraphError(f"Dependency cycle: {cycle}. A step cannot depend on itself, directly or indirectly.")
            state[id(child)] = 1
            path.append(child)
            iterators.append(iter(child.deps))
    return order


def _check_same_step(first: LazyStep, other: LazyStep) -> None:
    """Two handles with one identity lower to one step: refuse it when their functions differ."""
    if first is other or first.fn is other.fn:
        return
    code_a, code_b = fingerprint_function(first.fn), fingerprint_function(other.fn)
    if code_a is not None and code_b is not None and code_a.digest != code_b.digest or first.output_path != other.output_path:
        where = [f"{c.file}:{c.line}" if c and c.file else "?" for c in (code_a, code_b)]
        raise StepGraphError(
            f"Two different steps named {first.name!r} share identity {first.short_hash} (functions defined at "
            f"{where[0]} and {where[1]}, output paths {first.output_path!r} and {other.output_path!r}). Only one of "
            "them could run, and the other would silently get its result: give one of them a different name, "
            "version or hash_attrs."
        )


def lower(*handles: LazyStep | Iterable[LazyStep]) -> list[StepSpec]:
    """StepSpecs for ``handles`` and all their transitive dependencies, each once, deps first.

    Handles with the same identity lower to one spec. Accepts handles or iterables of handles.
    """
    flat: list[LazyStep] = []
    for item in handles:
        if isinstance(item, LazyStep):
            flat.append(item)
        elif isinstance(item, StepSpec):
            raise InvalidStepError(f"lower() takes lazy handles; {item.name!r} is already a StepSpec, pass it to the runner directly.")
        else:
            flat.extend(item)
    lowered: dict[str, StepSpec] = {}
    first_handles: dict[str, LazyStep] = {}
    result: list[StepSpec] = []
    for handle in topological_order(flat):
        if handle.identity in lowered:
            _check_same_step(first_handles[handle.identity], handle)
            continue
        first_handles[handle.identity] = handle
        spec = StepSpec(
            name=handle.name,
            fn=takes_context(handle.fn),
            deps=tuple(lowered[d.identity] for d in handle.deps),
            hash_attrs=handle.hash_attrs,
            output_path=handle.output_path,
            version=handle.version,
            resources=handle.resources,
        )
        lowered[handle.identity] = spec
        result.append(spec)
    return result
