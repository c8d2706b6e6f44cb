"""What every language model returns, and the call contract the trainer relies on."""

from __future__ import annotations

from typing import Mapping, NamedTuple, Protocol

import jax
import jax.numpy as jnp


class LmOutput(NamedTuple):
    """``logits``: [batch, seq, vocab] in the compute dtype; ``aux_loss``: a scalar already
    weighted by its coefficient, to be added to the language-modelling loss (0.0 for dense models);
    ``metrics``: the model's own scalars for the training step's metrics line, by name (an MoE's
    ``moe/dropped_fraction``), or None."""

    logits: jax.Array
    aux_loss: jax.Array
    metrics: Mapping[str, jax.Array] | None = None


def soft_cap(logits: jax.Array, cap: float | None) -> jax.Array:
    """``cap * tanh(logits / cap)``: logits bounded to ``(-cap, cap)`` (Gemma 2); None leaves them.

    A model's config names its cap (``final_logit_softcap``); whoever computes logits from
    ``hidden_states`` and ``unembedding`` instead of ``forward`` applies it too.
    """
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def final_logit_softcap(model) -> float | None:
    """The cap ``model``'s forward applies to its logits (None for models without one)."""
    return getattr(getattr(model, "config", None), "final_logit_softcap", None)


class LmModel(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput: ...

    def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> jax.Array: ...
