"""The graph of steps a run is given: every step reachable through ``deps``, each identity once.

Steps reach the runner as roots (nested lists of them are flattened) and bring their dependencies
along. :func:`collect_steps` walks the graph before any hash is computed (an identity of a cyclic
graph would never finish), refuses a cycle by naming it, and keeps one step per identity,
dependencies first. Two steps with one identity are the same step only if they would do the same
thing: same function and same output folder. Otherwise only one of them could run and the other
would silently get its result, so the graph is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from marin.errors import MarinError
from marin.execution.step_spec import StepSpec


class StepGraphError(MarinError, ValueError):
    """A dependency graph that cannot run: a cycle, or two different steps sharing an identity/output."""


def flatten_steps(items: Any, *, taker: str) -> list[StepSpec]:
    """The steps in ``items``: a step, or (nested) lists, tuples, sets or iterators of steps.

    ``taker`` names the function that was given ``items``, for the error message.
    """
    flat: list[StepSpec] = []
    stack = [iter([items] if isinstance(items, StepSpec) else items)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, StepSpec):
            flat.append(item)
        elif isinstance(item, (list, tuple, set, frozenset)) or hasattr(item, "__next__"):
            stack.append(iter(item))
        else:
            raise TypeError(f"{taker} takes StepSpecs and lazy handles (or lists of them), got {type(item).__name__}.")
    return flat


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
            if child_state is None and not child.deps:
                # A leaf (most of a sweep's steps): done as soon as it is met.
                state[id(child)] = 2
                order.append(child)
                continue
            if child_state == 1:
                start = next(i for i, n in enumerate(path) if n is child)
                cycle = " -> ".join(n.name for n in [*path[start:], child])
                raise StepGraphError(f"Dependency cycle: {cycle}. A step cannot depend on itself, directly or indirectly.")
            state[id(child)] = 1
            path.append(child)
            iterators.append(iter(child.deps))
    return order


def collect_steps(roots: Iterable[StepSpec]) -> list[StepSpec]:
    """``roots`` and all their transitive dependencies, dependencies first, one step per identity."""
    first: dict[str, StepSpec] = {}
    result: list[StepSpec] = []
    for step in topological_order(roots):
        seen = first.setdefault(step.identity, step)
        if seen is step:
            result.append(step)
        elif not _same_step(seen, step):
            raise StepGraphError(
                f"Two different steps named {step.name!r} share identity {step.short_hash} "
                f"(functions {seen.defined_at} and {step.defined_at}, output paths {seen.output_path!r} "
                f"and {step.output_path!r}). Only one of them could run, and the other would silently get its "
                "result: give one of them a different name, version or hash_attrs."
            )
    return result


def _same_step(a: StepSpec, b: StepSpec) -> bool:
    """Two steps of one identity that would do the same: one output folder, and one function."""
    if a.output_path != b.output_path:
        return False
    if _innermost(a.fn) is _innermost(b.fn):
        return True
    # Two function objects (closures of one factory, say): the same where they are defined, with the same code.
    code_a, code_b = a.code_fingerprint, b.code_fingerprint
    different_code = code_a is not None and code_b is not None and code_a.digest != code_b.digest
    return a.fn_description == b.fn_description and not different_code


def _innermost(fn: Any) -> Any:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn
