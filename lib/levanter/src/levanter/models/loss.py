"""The next-token cross-entropy every language model trains on.

Position ``t`` predicts ``tokens[t + 1]``; ``loss_mask[t]`` weights that prediction (see
``levanter.data.batch.Batch``). Returned as *sums* so the trainer can add them across
microbatches and divide once by the total weight: the mean over real tokens is then exact
however the batch was split.
"""

from __future__ import annotations

import functools
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
    logit_softcap: float | None = None,
) -> LossSums:
    """``next_token_loss(hidden @ unembedding, ...)`` without materialising the [B, T, V] logits.

    ``hidden``: [B, T, embed] (``model.hidden_states``); ``unembedding``: [embed, V]
    (``model.unembedding()``). The sequence is cut into blocks of positions, each block holding
    every row and about ``block_size`` tokens in all (default ``default_block_size(V)``), and the
    output layer runs one block at a time in forward and backward; the backward recomputes each
    block's logits instead of storing them. Only one block of logits exists at a time, and since
    every block keeps the batch axis, a batch split over devices stays split: each device scores
    its own rows.

    It pays one extra output-layer matmul. When the hidden size is tiny next to the vocabulary
    (``llama_nano``), the logits' memory traffic and not the matmul FLOPs sets the speed, and
    cache-sized blocks win (~30% per step on CPU); from hidden ~128 up it is a memory saving, for
    about a third more output-layer FLOPs. See ``docs/models.md`` for figures.

    ``logit_softcap``: the logits are ``cap * tanh(hidden @ unembedding / cap)``, as the model's
    own forward computes them (``levanter.models.lm.final_logit_softcap``).
    """
    batch, seq_len, _ = hidden.shape
    if block_size is None:
        block_size = default_block_size(unembedding.shape[-1])
    positions = max(1, min(block_size // batch, seq_len))
    num_blocks = -(-seq_len // positions)
    pad = num_blocks * positions - seq_len

    targets = jnp.roll(tokens, -1, axis=-1).astype(jnp.int32)
    mask = loss_mask.astype(jnp.float32) * (jnp.arange(seq_len) < seq_len - 1)
    x = hidden
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        mask = jnp.pad(mask, ((0, 0), (0, pad)))

    def to_blocks(a):  # [B, num_blocks * positions, ...] -> [num_blocks, B * positions, ...], rows major
        a = a.reshape(batch, num_blocks, positions, *a.shape[2:]).swapaxes(0, 1)
        return a.reshape(num_blocks, batch * positions, *a.shape[3:])

    def from_blocks(a):  # [num_blocks, B * positions] -> [B, num_blocks * positions]
        return a.reshape(num_blocks, batch, positions).swapaxes(0, 1).reshape(batch, -1)

    # Within a block the rows' positions are flattened: 2-D matmuls run ~10% faster on CPU than
    # the same work with a separate batch axis, and a split over rows stays a split of that axis.
    lse, target_logits = _blocked_lse_and_target(to_blocks(x), unembedding, to_blocks(targets), logit_softcap)
    lse, target_logits = from_blocks(lse), from_blocks(target_logits)
    loss_sum = jnp.sum((lse - target_logits) * mask)
    z_loss_sum = z_loss_weight * jnp.sum(jnp.square(lse) * mask)
    return LossSums(loss_sum, jnp.sum(mask), z_loss_sum)


# Logits per block of ``fused_next_token_loss``: on CPU about 4M (16 MiB in float32), a size that
# stays in cache; on accelerators 64M (256 MiB), large enough that each block's matmul fills the chip
# and a 128k vocabulary at 16k tokens per device takes ~32 blocks.
CPU_BLOCK_LOGITS = 1 << 22
ACCELERATOR_BLOCK_LOGITS = 1 << 26


def default_block_size(vocab_size: int, num_devices: int = 1) -> int:
    """Tokens per block of ``fused_next_token_loss`` (all rows together) for this platform.

    ``num_devices`` is the number of devices the batch's rows are split over: each holds its
    share of a block's logits.
    """
    per_device = CPU_BLOCK_LOGITS if jax.default_backend() == "cpu" else ACCELERATOR_BLOCK_LOGITS
    return max(per_device * num_devices // vocab_size, 16)


def _block_logits(x: jax.Array, w: jax.Array, cap: float | None) -> jax.Array:
    logits = jnp.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
    return logits if cap is None else cap * jnp.tanh(logits / cap)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _blocked_lse_and_target(x: jax.Array, w: jax.Array, targets: jax.Array, cap: float | None) -> tuple[jax.Array, jax.Array]:
    """Per token: log-sum-exp of its logits and its target's logit. x: [blocks, block, E]."""

    def one_block(args):
        xb, tb = args
        logits = _block_logits(xb, w, cap)
        return jax.nn.logsumexp(logits, axis=-1), jnp.take_along_axis(logits, tb[:, None], axis=-1)[:, 0]

    return jax.lax.map(one_block, (x, targets))


def _blocked_forward(x, w, targets, cap):
    lse, target_logits = _blocked_lse_and_target(x, w, targets, cap)
    return (lse, target_logits), (x, w, targets, lse)


def _blocked_backward(cap, residuals, cotangents):
    x, w, targets, lse = residuals
    g_lse, g_target = cotangents

    def one_block(dw, args):
        xb, tb, lse_b, g_lse_b, g_target_b = args
        logits = _block_logits(xb, w, cap)
        # d lse / d logits = softmax; d target_logit / d logits = one-hot(target).
        dlogits = jnp.exp(logits - lse_b[:, None]) * g_lse_b[:, None]
        dlogits = dlogits + (jnp.arange(logits.shape[-1])[None, :] == tb[:, None]) * g_target_b[:, None]
        if cap is not None:  # through cap * tanh(z / cap), whose derivative is 1 - (capped / cap)^2
            dlogits = dlogits * (1 - jnp.square(logits / cap))
        # Both products in the compute dtype (bfloat16 runs on the matrix units) with float32 sums,
        # as the plain loss's backward does.
        dlogits = dlogits.astype(xb.dtype)
        dx = jnp.dot(dlogits, w.astype(xb.dtype).T, preferred_element_type=jnp.float32).astype(xb.dtype)
        dw = dw + jnp.dot(xb.T, dlogits, preferred_element_type=jnp.float32)
        return dw, dx

    dw, dx = jax.lax.scan(one_block, jnp.zeros(w.shape, jnp.float32), (x, targets, lse, g_lse, g_target))
    return dx, dw.astype(w.dtype), None


_blocked_lse_and_target.defvjp(_blocked_forward, _blocked_backward)
