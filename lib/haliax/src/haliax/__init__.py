"""haliax: named axes for JAX arrays.

Owns logical axis names for parameters and activations, the neural-network layers models need,
and partitioning of arrays and jitted functions over a device mesh. It depends only on rigging.

Arrays stay plain ``jax.Array``s; their dimension names ride beside them, declared by each
module (``NamedModule.param_axes``). See ``docs/models.md`` for why.
"""

from haliax import axes, nn, partitioning
from haliax.axes import Axes
from haliax.module import NamedModule, Stacked, logical_axes
from haliax.partitioning import AxisRules, constrain, make_mesh, shard, shardings_for, use_mesh

__all__ = [
    "Axes",
    "AxisRules",
    "NamedModule",
    "Stacked",
    "axes",
    "constrain",
    "logical_axes",
    "make_mesh",
    "nn",
    "partitioning",
    "shard",
    "shardings_for",
    "use_mesh",
]
