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


def fused_next_token_loss(
    hidden: jax.Array,
    unembedding: jax.Array,
    tokens: jax.Array,
    loss_mask: jax.Array,
    *,
    z_loss_weight: float = 0.0,
    block_size: int | None = None,
) -> LossSums:
    """``next_token_loss(hidden @ unembedding, ...)`` without materialising the [B, T, V] logits.

    ``hidden``: [B, T, embed] (``model.hidden_states``); ``unembedding``: [embed, V]
    (``model.unembedding()``). Tokens are processed ``block_size`` at a time (default: about 4M
    logits per block) in forward and backward; the backward recomputes each block's logits instead
    of storing them. When the hidden size is tiny next to the vocabulary (``llama_nano``), the
    logits' memory traffic and not the matmul FLOPs sets the speed, and cache-sized blocks win
    (~30% per step on CPU); from hidden ~128 up the extra matmul costs more than it saves. It also
    caps the output layer's memory at one block. See ``docs/models.md`` for figures.
    """
    batch, seq_len, embed = hidden.shape
    vocab = unembedding.shape[-1]
    n = batch * seq_len
    if block_size is None:
        block_size = int(min(max(2**22 // vocab, 16), 4096))
    block_size = min(block_size, n)
    num_blocks = -(-n // block_size)
    pad = num_blocks * block_size - n

    targets = jnp.roll(tokens, -1, axis=-1).reshape(n).astype(jnp.int32)
    mask = (loss_mask.astype(jnp.float32) * (jnp.arange(seq_len) < seq_len - 1)).reshape(n)
    x = hidden.reshape(n, embed)
    if pad:
        x = jnp.pad(x, ((0, pad), (0, 0)))
        targets = jnp.pad(targets, (0, pad))
        mask = jnp.pad(mask, (0, pad))
    lse, target_logits = _blocked_lse_and_target(
        x.reshape(num_blocks, block_size, embed), unembedding, targets.reshape(num_blocks, block_size)
    )
    lse, target_logits = lse.reshape(-1), target_logits.reshape(-1)
    loss_sum = jnp.sum((lse - target_logits) * mask)
    z_loss_sum = z_loss_weight * jnp.sum(jnp.square(lse) * mask)
    return LossSums(loss_sum, jnp.sum(mask), z_loss_sum)


def _block_logits(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32)


@jax.custom_vjp
def _blocked_lse_and_target(x: jax.Array, w: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per token: log-sum-exp of its logits and its target's logit. x: [blocks, block, E]."""

    def one_block(args):
        xb, tb = args
        logits = _block_logits(xb, w)
        return jax.nn.logsumexp(logits, axis=-1), jnp.take_along_axis(logits, tb[:, None], axis=-1)[:, 0]

    return jax.lax.map(one_block, (x, targets))


def _blocked_forward(x, w, targets):
    lse, target_logits = _blocked_lse_and_target(x, w, targets)
    return (lse, target_logits), (x, w, targets, lse)


def _blocked_backward(residuals, cotangents):
    x, w, targets, lse = residuals
    g_lse, g_target = cotangents

    def one_block(dw, args):
        xb, tb, lse_b, g_lse_b, g_target_b = args
        logits = _block_logits(xb, w)
        # d lse / d logits = softmax; d target_logit / d logits = one-hot(target).
        dlogits = jnp.exp(logits - lse_b[:, None]) * g_lse_b[:, None]
        dlogits = dlogits + (jnp.arange(logits.shape[-1])[None, :] == tb[:, None]) * g_target_b[:, None]
        dx = jnp.dot(dlogits.astype(xb.dtype), w.astype(xb.dtype).T, preferred_element_type=jnp.float32).astype(xb.dtype)
        dw = dw + jnp.dot(xb.T.astype(jnp.float32), dlogits)
        return dw, dx

    dw, dx = jax.lax.scan(one_block, jnp.zeros(w.shape, jnp.float32), (x, targets, lse, g_lse, g_target))
    return dx, dw.astype(w.dtype), None


_blocked_lse_and_target.defvjp(_blocked_forward, _blocked_backward)
