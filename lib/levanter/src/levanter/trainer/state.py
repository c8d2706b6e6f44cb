"""Everything a run needs to continue exactly: parameters, optimizer state, step and RNG key."""

from __future__ import annotations

import equinox as eqx
import jax


class TrainState(eqx.Module):
    """``params`` holds the model's floating arrays (``eqx.partition`` of the model, ``None``
    elsewhere); the rest of the model (static structure, integer buffers) lives beside the state,
    unchanged by training. ``key`` is a raw uint32 PRNG key split once per step, so a resumed run
    draws the same randomness as an uninterrupted one."""

    step: jax.Array  # int32 scalar: optimizer updates applied so far
    params: eqx.Module
    opt_state: object
    key: jax.Array
