"""Modules whose parameters know their logical axis names.

A ``NamedModule`` is an ``equinox.Module`` that lists, for each of its array fields, the logical
names of its dimensions. ``logical_axes(tree)`` turns any pytree of such modules into a
same-shaped tree of ``Axes``, which partitioning maps onto a device mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import equinox as eqx
import jax

from haliax.axes import LAYERS, Axes


class NamedModule(eqx.Module):
    """Base for modules with parameters. Subclasses override ``param_axes``."""

    def param_axes(self) -> Mapping[str, tuple[str | None, ...]]:
        """Field name -> logical names of that array's dimensions."""
        return {}


class Stacked(eqx.Module):
    """``count`` copies of one module whose every array has an extra leading ``layers`` axis.

    Used to run identical blocks with ``jax.lax.scan``: one compiled block body instead of
    ``count`` unrolled copies, which keeps compile time flat in depth.
    """

    inner: Any
    count: int = eqx.field(static=True)

    def unstack(self) -> list[Any]:
        return [jax.tree.map(lambda a, i=i: a[i], self.inner) for i in range(self.count)]


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array) or hasattr(x, "shape") and hasattr(x, "dtype")


def logical_axes(tree: Any) -> Any:
    """A tree shaped like ``tree`` whose array leaves are replaced by their ``Axes``.

    Arrays not declared by any ``NamedModule`` get ``Axes`` of ``None``s (replicated), so the
    result always pairs one-to-one with ``tree``.
    """
    return _axes_of(tree, 0)


def _axes_of(node: Any, stacked_dims: int) -> Any:
    # ``stacked_dims``: how many leading ``layers`` dimensions enclosing ``Stacked`` modules added.
    if _is_array(node):
        return Axes((None,) * (node.ndim - stacked_dims))
    if isinstance(node, Stacked):
        inner = _axes_of(node.inner, stacked_dims + 1)
        inner = jax.tree.map(lambda a: a.prepend(LAYERS), inner, is_leaf=lambda x: isinstance(x, Axes))
        return _replace_fields(node, {"inner": inner})
    if isinstance(node, eqx.Module):
        declared = node.param_axes() if isinstance(node, NamedModule) else {}
        updates = {}
        for field in dataclasses.fields(node):
            if field.metadata.get("static", False):
                continue
            value = getattr(node, field.name)
            if field.name in declared and value is not None:
                names = tuple(declared[field.name])
                if len(names) + stacked_dims != value.ndim:
                    raise ValueError(
                        f"{type(node).__name__}.{field.name} has shape {value.shape} but declares "
                        f"{len(names)} axis names {names}."
                    )
                updates[field.name] = Axes(names)
            else:
                updates[field.name] = _axes_of(value, stacked_dims)
        return _replace_fields(node, updates)
    if isinstance(node, (list, tuple)):
        items = [_axes_of(v, stacked_dims) for v in node]
        return type(node)(items) if not hasattr(node, "_fields") else type(node)(*items)
    if isinstance(node, dict):
        return {k: _axes_of(v, stacked_dims) for k, v in node.items()}
    return node


def _replace_fields(module: eqx.Module, updates: dict[str, Any]) -> eqx.Module:
    # Equinox modules are frozen dataclasses with custom __init__s; copying and setting fields
    # directly avoids re-running (and re-validating) the constructor.
    new = object.__new__(type(module))
    for field in dataclasses.fields(module):
        object.__setattr__(new, field.name, updates.get(field.name, getattr(module, field.name)))
    return new
