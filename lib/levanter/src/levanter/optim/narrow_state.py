"""An optimizer's state stored in bfloat16 between steps and computed in float32.

:func:`stored_in_bfloat16` wraps an optax transformation (Adam's moment scaling): its float32
state is widened from bfloat16 for the update, the update is computed exactly as in float32, and
the new state is narrowed to bfloat16 to be stored. Half the bytes of float32 moments, and the
same update in the step that made them; later steps read moments rounded to 8 significant bits.

Narrowing rounds *stochastically* by default: up or down, with the probabilities that make the
stored value right on average. Rounding to nearest stalls a moving average whose change per step
is below half a bfloat16 unit (between 2^-9 and 2^-8 of its size): with ``beta2 = 0.999`` and a
gradient like the average, the second moment moves by 0.1% of itself a step and would never move
at all. Stochastic rounding moves it by that much on average. The random bits come from a key kept
in the state and split each step, so a run is reproducible and resumes from a checkpoint as it ran.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# float32's bit pattern is bfloat16's followed by 16 more mantissa bits. (Plain ints: a jnp constant
# here would start JAX's devices when the module is imported, before jax.distributed can join a run.)
_DROPPED_BITS = 16
_KEPT = 0xFFFF0000


class NarrowState(NamedTuple):
    """The wrapped transformation's state with its float32 leaves stored as bfloat16; ``key`` draws
    the random bits of stochastic rounding."""

    inner: Any
    key: jax.Array


def stored_in_bfloat16(inner: optax.GradientTransformation, *, stochastic: bool = True,
                       seed: int = 0) -> optax.GradientTransformationExtraArgs:
    """``inner`` with its float32 state kept in bfloat16; ``stochastic=False`` rounds to nearest."""
    inner = optax.with_extra_args_support(inner)

    def init(params):
        state = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if _is_float32(x) else x, inner.init(params))
        return NarrowState(inner=state, key=jax.random.PRNGKey(seed))

    def update(updates, state, params=None, **extra_args):
        wide = jax.tree.map(lambda x: x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x, state.inner)
        updates, new_state = inner.update(updates, wide, params, **extra_args)
        key, rounding_key = jax.random.split(state.key)
        leaves, tree = jax.tree.flatten(new_state)
        keys = jax.random.split(rounding_key, max(len(leaves), 1))
        narrow = [_narrowed(x, k, stochastic) if _is_float32(x) else x for x, k in zip(leaves, keys)]
        return updates, NarrowState(inner=jax.tree.unflatten(tree, narrow), key=key)

    return optax.GradientTransformationExtraArgs(init, update)


def stochastic_round_to_bfloat16(x: jax.Array, key: jax.Array) -> jax.Array:
    """``x`` (float32) in bfloat16, rounded away from zero with probability equal to the fraction of
    a bfloat16 unit that truncation would drop: the expected result is ``x`` itself."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    noise = jax.random.bits(key, x.shape, jnp.uint32) >> (32 - _DROPPED_BITS)
    # Noise below the kept bits carries into them with the chance the dropped bits give. The sign
    # bit is apart from the magnitude, so negative values round as their magnitudes do.
    rounded = jax.lax.bitcast_convert_type((bits + noise) & jnp.uint32(_KEPT), jnp.float32)
    return rounded.astype(jnp.bfloat16)  # exact: no dropped bits remain


def _narrowed(x: jax.Array, key: jax.Array, stochastic: bool) -> jax.Array:
    return stochastic_round_to_bfloat16(x, key) if stochastic else x.astype(jnp.bfloat16)


def _is_float32(x: Any) -> bool:
    return hasattr(x, "dtype") and x.dtype == jnp.float32
