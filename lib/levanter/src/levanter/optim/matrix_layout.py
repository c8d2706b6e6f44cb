"""What each parameter is to an optimizer that treats matrices as matrices (Muon, Scion, SOAP, Kron).

A :class:`MatrixLayout` says, for one parameter, which leading dimensions stack independent copies
(``layers``, ``experts``), which dimensions are the matrix's fan-in and which its fan-out, and its
role: ``matrix`` (a hidden linear layer), ``embedding`` (the input token table), ``head`` (the
output projection to the vocabulary) or ``vector`` (norm scales, biases). :meth:`MatrixLayout.to_matrix`
turns the parameter (or its gradient) into ``[copies, fan_in, fan_out]``, grouped axes flattened,
and :meth:`MatrixLayout.from_matrix` undoes it exactly, so an optimizer writes its per-matrix
arithmetic once and ``vmap``s it over the copies.

The rules, from the logical axis names alone (``param_axes``, see :data:`levanter.optim.base.ParamAxes`):

- Leading ``layers`` / ``experts`` axes stack copies; only leading ones (a router's ``experts``
  output axis is part of its matrix).
- A ``vocab`` axis first is the input embedding (fan-in ``vocab``, a one-hot index, fan-out the
  rest); ``vocab`` last is the output head (fan-out ``vocab``). A tied embedding is one
  ``("vocab", "embed")`` table: it is the embedding.
- Fewer than two remaining axes: a vector. So are arrays whose axes are only per-head ones
  (``heads``/``kv_heads``/``head_dim``): those are q/k/v biases, one vector split per head.
- Axes starting with ``embed`` (or ``lora_rank``): fan-in is that axis, fan-out the rest; ending
  with ``embed`` (or ``lora_rank``): fan-in the rest, fan-out that axis. This is a ``Linear``
  weight's ``in_axes + out_axes`` for every projection our models have.
- Anything else with two or more axes: fan-in all but the last axis, fan-out the last.

Without axis names (``build`` called on raw arrays, or an array no module declared) the rule is by
rank: 2-D arrays are matrices ``[fan_in, fan_out]``, anything else is a vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from levanter.optim.param_axes import STACKING_AXES, ParamAxes

ROLES = ("matrix", "embedding", "head", "vector")

# Axes a Linear contracts with at one end of its weight: the model width, and a LoRA adapter's rank.
_CONTRACTED_AXES = frozenset({"embed", "lora_rank"})
# Axes that only split one vector per attention head.
_PER_HEAD_AXES = frozenset({"heads", "kv_heads", "head_dim"})


@dataclass(frozen=True)
class MatrixLayout:
    """One parameter as ``[copies, fan_in, fan_out]``; dimensions are indices into the parameter's shape."""

    role: str
    shape: tuple[int, ...]
    stack: tuple[int, ...]
    fan_in: tuple[int, ...]
    fan_out: tuple[int, ...]

    @property
    def is_matrix_shaped(self) -> bool:
        """True for matrices, embeddings and heads: everything with a fan-in and a fan-out."""
        return self.role != "vector"

    @property
    def copies(self) -> int:
        return math.prod(self.shape[d] for d in self.stack)

    @property
    def fan_in_size(self) -> int:
        return math.prod(self.shape[d] for d in self.fan_in)

    @property
    def fan_out_size(self) -> int:
        return math.prod(self.shape[d] for d in self.fan_out)

    @property
    def matrix_shape(self) -> tuple[int, int, int]:
        """``(copies, fan_in, fan_out)``; a vector is ``(copies, 1, size)``."""
        return self.copies, self.fan_in_size, self.fan_out_size

    def to_matrix(self, x: jax.Array) -> jax.Array:
        order = self.stack + self.fan_in + self.fan_out
        return jnp.transpose(x, order).reshape(self.matrix_shape)

    def from_matrix(self, m: jax.Array) -> jax.Array:
        order = self.stack + self.fan_in + self.fan_out
        permuted = m.reshape(tuple(self.shape[d] for d in order))
        return jnp.transpose(permuted, tuple(order.index(d) for d in range(len(self.shape))))


def layout_of(shape: tuple[int, ...], names: Any = None) -> MatrixLayout:
    """The layout of an array of ``shape`` whose dimensions have the logical ``names`` (or None)."""
    shape = tuple(shape)
    names = tuple(names) if names is not None else (None,) * len(shape)
    if len(names) != len(shape):
        raise ValueError(f"matrix_layout: axis names {names} do not match shape {shape}.")
    if all(n is None for n in names):
        if len(shape) == 2:
            return MatrixLayout("matrix", shape, (), (0,), (1,))
        return _vector(shape, ())

    stack = 0
    while stack < len(names) and names[stack] in STACKING_AXES:
        stack += 1
    stacked = tuple(range(stack))
    core = list(range(stack, len(shape)))
    core_names = [names[d] for d in core]
    if len(core) < 2 or set(core_names) <= _PER_HEAD_AXES:
        return _vector(shape, stacked)
    if core_names[0] == "vocab":
        return MatrixLayout("embedding", shape, stacked, (core[0],), tuple(core[1:]))
    if core_names[-1] == "vocab":
        return MatrixLayout("head", shape, stacked, tuple(core[:-1]), (core[-1],))
    if core_names[0] in _CONTRACTED_AXES:
        return MatrixLayout("matrix", shape, stacked, (core[0],), tuple(core[1:]))
    return MatrixLayout("matrix", shape, stacked, tuple(core[:-1]), (core[-1],))


def _vector(shape: tuple[int, ...], stacked: tuple[int, ...]) -> MatrixLayout:
    rest = tuple(d for d in range(len(shape)) if d not in stacked)
    return MatrixLayout("vector", shape, stacked, (), rest)


def matrix_layouts(params: Any, param_axes: ParamAxes | None = None) -> Any:
    """A tree shaped like ``params`` with the :class:`MatrixLayout` of each array.

    ``params`` may hold arrays or ``jax.ShapeDtypeStruct``s; optax's masked-out slots
    (``optax.MaskedNode``) are kept as they are, so this also works on the updates a branch of
    ``optax.partition`` sees.
    """
    masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    if param_axes is None:
        return jax.tree.map(lambda p: p if masked(p) else layout_of(p.shape), params, is_leaf=masked)
    return jax.tree.map(
        lambda p, names: p if masked(p) else layout_of(p.shape, names), params, param_axes, is_leaf=masked
    )
