"""What every language model returns, and the call contract the trainer relies on."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax


class LmOutput(NamedTuple):
    """``logits``: [batch, seq, vocab] in the compute dtype; ``aux_loss``: a scalar already
    weighted by its coefficient, to be added to the language-modelling loss (0.0 for dense models)."""

    logits: jax.Array
    aux_loss: jax.Array


class LmModel(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput: ...

    def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> jax.Array: ...
