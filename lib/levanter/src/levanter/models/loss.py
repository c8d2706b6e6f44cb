"""The next-token cross-entropy every language model trains on.

Position ``t`` predicts ``tokens[t + 1]``; ``loss_mask[t]`` weights that prediction (see
``levanter.data.batch.Batch``). Returned as *sums* so the trainer can add them across
microbatches and divide once by the total weight: the mean over real tokens is then exact
however the batch was split.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class LossSums(NamedTuple):
    loss_sum: jax.Array  # sum over positions of mask * -log p(next token), float32
    weight_sum: jax.Array  # sum of the mask
    z_loss_sum: jax.Array  # z_loss_weight * sum of mask * logsumexp(logits)^2 (0 when the weight is 0)


def next_token_loss(logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array, *, z_loss_weight: float = 0.0) -> LossSums:
    """Cross-entropy sums for ``logits`` [B, T, V] against the tokens shifted left by one.

    Computed in float32 with a max-subtracted log-sum-exp whatever the logits' dtype. The last
    position has no target inside the window and is always excluded. The z-loss (PaLM) pulls
    ``logsumexp`` towards 0 to keep bfloat16 logits well-scaled; the objective to minimise is
    ``(loss_sum + z_loss_sum) / weight_sum``.
    """
    logits = logits.astype(jnp.float32)
    targets = jnp.roll(tokens, -1, axis=-1)
    mask = loss_mask.astype(jnp.float32) * (jnp.arange(tokens.shape[-1]) < tokens.shape[-1] - 1)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    loss_sum = jnp.sum((lse - target_logits) * mask)
    z_loss_sum = z_loss_weight * jnp.sum(jnp.square(lse) * mask)
    return LossSums(loss_sum, jnp.sum(mask), z_loss_sum)
