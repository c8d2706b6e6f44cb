"""Mixed precision: parameters and optimizer state stay f32; the forward/backward computes in a
lower precision where the hardware is built for it.

Casting happens inside the jitted loss, so the gradient flows back through the cast and arrives in
f32 for the optimizer. On CPU bf16 matmuls are emulated and slower than f32, hence the "auto"
policy picks f32 there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from levanter.errors import LevanterError

COMPUTE_DTYPE_POLICIES = ("auto", "float32", "bfloat16", "float16")


class MixedPrecisionError(LevanterError, ValueError):
    """An unknown compute-dtype policy."""


def resolve_compute_dtype(policy: str, platform: str | None = None) -> jnp.dtype:
    """``"auto"``: bf16 on accelerators (GPU/TPU), f32 on CPU; otherwise the named dtype."""
    if policy not in COMPUTE_DTYPE_POLICIES:
        raise MixedPrecisionError(
            f"Unknown compute dtype policy {policy!r}; choose one of {', '.join(COMPUTE_DTYPE_POLICIES)}."
        )
    if policy == "auto":
        platform = platform or jax.default_backend()
        return jnp.dtype(jnp.float32 if platform == "cpu" else jnp.bfloat16)
    return jnp.dtype(policy)


def cast_floating(tree, dtype):
    """Cast every floating array leaf of ``tree`` to ``dtype``; integers and non-arrays pass through."""
    dtype = jnp.dtype(dtype)

    def cast(x):
        if isinstance(x, jax.Array | jax.ShapeDtypeStruct) or hasattr(x, "dtype"):
            if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
                if isinstance(x, jax.ShapeDtypeStruct):
                    return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
                return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)
