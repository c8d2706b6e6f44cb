"""Token embedding table, usable in reverse as a tied output projection."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from haliax.axes import EMBED, VOCAB
from haliax.module import NamedModule


class Embedding(NamedModule):
    weight: jax.Array  # [vocab, embed]

    def __init__(self, vocab_size: int, embed_dim: int, *, key: jax.Array, init_std: float = 0.02, dtype=jnp.float32):
        self.weight = init_std * jax.random.normal(key, (vocab_size, embed_dim), dtype=dtype)

    def param_axes(self):
        return {"weight": (VOCAB, EMBED)}

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.weight, tokens, axis=0)

    def unembed(self, x: jax.Array) -> jax.Array:
        """Logits ``x · Wᵀ`` for tied input/output embeddings."""
        return jnp.einsum("...e,ve->...v", x, self.weight.astype(x.dtype))
