"""Everything a run needs to continue exactly: parameters, optimizer state, step, RNG key, frozen
arrays, and the weight average and bad-step history when the run keeps them."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax


class TrainState(eqx.Module):
    """``params`` holds the arrays the optimizer trains (by default the model's floating arrays:
    ``eqx.partition`` of the model, ``None`` elsewhere); the rest of the model (static structure,
    integer buffers) lives beside the state, unchanged by training. ``key`` is a raw uint32 PRNG
    key split once per step, so a resumed run draws the same randomness as an uninterrupted one.

    ``frozen`` holds arrays that the step reads but never updates: the base weights under LoRA
    adapters, a reference model for preference training (:class:`FrozenArrays`). They are an
    argument of the jitted step, not constants compiled into it, have no optimizer state, and are
    checkpointed with the rest so a run resumes without the weights it started from. ``None`` (the
    default) adds no leaf: a plain run's state, compiled step and checkpoints are unchanged.

    ``ema``: the exponential moving average of the weights (``TrainerConfig.ema_decay``), shaped and
    sharded like ``params``. ``bad_steps``: the recent losses and the count of skipped steps
    (``TrainerConfig.skip_bad_steps``, :class:`levanter.trainer.bad_steps.BadStepHistory`). Both
    ``None`` unless asked for, adding no leaf, like ``frozen``.
    """

    step: jax.Array  # int32 scalar: optimizer updates applied so far
    params: eqx.Module
    opt_state: object
    key: jax.Array
    frozen: Any = None
    ema: Any = None
    bad_steps: Any = None


class FrozenArrays(eqx.Module):
    """The frozen arrays of a run. ``model``: the model's floating arrays that do not train (the
    LoRA base weights; ``None`` when every floating array trains). ``reference``: a copy of the
    trainable arrays as training started, the reference model of a preference objective (``None``
    when none is kept; with LoRA the reference is the base model itself: adapters at zero)."""

    model: Any = None
    reference: Any = None

    def reference_params(self, params: Any) -> Any:
        """The reference model's trainable arrays: the copy kept, else (under LoRA) ``params`` with the adapters at zero."""
        return self.reference if self.reference is not None else jax.tree.map(jax.numpy.zeros_like, params)
