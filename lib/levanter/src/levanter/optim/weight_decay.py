"""Which parameters decoupled weight decay applies to, chosen by role and by path.

Every optimizer with decoupled weight decay adds ``weight_decay * param`` to the update of the
parameters this mask selects (``OptimizerConfig._decay``). A parameter's role is read from its
logical axes (:mod:`levanter.optim.matrix_layout`): ``matrix`` (hidden projections), ``embedding``
(the token table), ``head`` (the output projection) or ``vector`` (norm scales, biases). By default
only hidden matrices are decayed. Decaying a norm's scale pulls it towards zero and a bias towards
an arbitrary origin; an embedding row is shrunk at every step but only pushed back on the steps
its token appears, so rare tokens fade, and the head is its mirror image (or the same table, tied).

``OptimizerConfig.weight_decay_exclude`` and ``weight_decay_include`` hold entries that are either
a role or a glob (``fnmatch``, case-sensitive) over the parameter's dotted path, as
:func:`parameter_paths` writes it (``layers.0.mlp.up_proj.weight``; ``*norm*``, ``*.lm_head.weight``).
A parameter is decayed when an include entry matches it, or else when no exclude entry does.
Without axis names (``build`` called on raw arrays) roles go by rank: 2-D arrays are matrices,
anything else a vector.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import jax

from levanter.optim.param_axes import DEFAULT_WEIGHT_DECAY_EXCLUDE, ParamAxes
from levanter.optim.errors import OptimizerConfigError
from levanter.optim.matrix_layout import ROLES, matrix_layouts

_GLOB_CHARACTERS = frozenset("*?[.")


def check_patterns(owner: str, field: str, entries: Any) -> tuple[str, ...]:
    """``entries`` as a tuple (JSON and YAML give lists), each a role or a path glob; a bare word
    that is no role is refused, since as a glob it would only match a top-level parameter of that name."""
    if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
        raise OptimizerConfigError(f"{owner}.{field} must be a list of roles or path patterns; got {entries!r}.")
    entries = tuple(entries)
    for entry in entries:
        if entry not in ROLES and not (_GLOB_CHARACTERS & set(entry)):
            raise OptimizerConfigError(
                f"{owner}.{field}: {entry!r} is neither a role ({', '.join(ROLES)}) nor a path pattern; "
                f"for parameters by name write a glob such as '*{entry}*' or '*.{entry}'."
            )
    return entries


def parameter_paths(params: Any) -> Any:
    """A tree shaped like ``params`` with each parameter's dotted path (``layers.0.mlp.up_proj.weight``)."""

    def part(key) -> str:
        for attribute in ("name", "key", "idx"):
            if hasattr(key, attribute):
                return str(getattr(key, attribute))
        return str(key)

    return jax.tree_util.tree_map_with_path(lambda path, _: ".".join(part(k) for k in path), params)


def weight_decay_mask(
    params: Any,
    param_axes: ParamAxes | None = None,
    exclude: tuple[str, ...] = DEFAULT_WEIGHT_DECAY_EXCLUDE,
    include: tuple[str, ...] = (),
) -> Any:
    """A tree of bools shaped like ``params``: True where weight decay applies (see the module docstring)."""

    def matches(entries, role, path) -> bool:
        return any(entry == role or fnmatchcase(path, entry) for entry in entries)

    def decide(layout, path) -> bool:
        return matches(include, layout.role, path) or not matches(exclude, layout.role, path)

    return jax.tree.map(decide, matrix_layouts(params, param_axes), parameter_paths(params))
