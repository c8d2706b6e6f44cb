"""Logical axis names and the small record that carries them beside a parameter array.

Parameters stay plain ``jax.Array`` leaves; each module declares, per parameter field, the
logical name of every dimension (see ``docs/models.md`` for why names ride beside arrays rather
than inside them). Partitioning maps these logical names to device-mesh axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

# The logical axes models use. A name says what a dimension *means*; `partitioning.AxisRules`
# decides where it lives on a device mesh.
BATCH = "batch"
SEQ = "seq"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
VOCAB = "vocab"
LAYERS = "layers"
EXPERTS = "experts"


@dataclass(frozen=True)
class Axes:
    """The logical names of one array's dimensions, outermost first (``None`` = unnamed).

    Deliberately not a pytree node, so a tree of ``Axes`` has exactly the structure of the
    parameter tree it describes and ``jax.tree.map`` pairs them one-to-one.
    """

    names: tuple[str | None, ...]

    def __init__(self, names: Iterable[str | None]):
        object.__setattr__(self, "names", tuple(names))

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self):
        return iter(self.names)

    def prepend(self, name: str | None) -> "Axes":
        """The names of the same array stacked along a new leading axis (e.g. ``layers``)."""
        return Axes((name, *self.names))

    def __repr__(self) -> str:
        return f"Axes{self.names!r}"
