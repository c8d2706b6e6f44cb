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
    targets, mask = _targets_and_mask(tokens, loss_mask)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return _sums(lse, target_logits, mask, z_loss_weight)


def _targets_and_mask(tokens: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The next token of each position, and the float32 weight of predicting it (the last position: 0)."""
    seq_len = tokens.shape[-1]
    targets = jnp.roll(tokens, -1, axis=-1).astype(jnp.int32)
    return targets, loss_mask.astype(jnp.float32) * (jnp.arange(seq_len) < seq_len - 1)


def _sums(lse: jax.Array, target_logits: jax.Array, mask: jax.Array, z_loss_weight: float) -> LossSums:
    z_loss_sum = z_loss_weight * jnp.sum(jnp.square(lse) * mask)
    return LossSums(jnp.sum((lse - target_logits) * mask), jnp.sum(mask), z_loss_sum)


def fused_next_token_loss(
    hidden: jax.Array,
    unembedding: jax.Array,
    tokens: jax.Array,
    loss_mask: jax.Array,
    *,
    z_loss_weight: float = 0.0,
    block_size: int | None = None,
    logit_softcap: float | None = None,
    vocab_block: int | None = None,
) -> LossSums:
    """``next_token_loss(hidden @ unembedding, ...)`` without materialising the [B, T, V] logits.

    ``hidden``: [B, T, embed] (``model.hidden_states``); ``unembedding``: [embed, V]
    (``model.unembedding()``). The sequence is cut into blocks of positions, each block holding
    every row and at most ``block_size`` tokens in all (default ``default_block_size(V)``; where the
    cuts fall: :func:`position_blocks`), and the output layer runs one block at a time in forward
    and backward; the backward recomputes each block's logits instead of storing them. Only one
    block of logits exists at a time, and since every block keeps the batch axis, a batch split over
    devices stays split: each device scores its own rows.

    It pays one extra output-layer matmul. When the hidden size is tiny next to the vocabulary
    (``llama_nano``), the logits' memory traffic and not the matmul FLOPs sets the speed, and
    cache-sized blocks win (~30% per step on CPU); from hidden ~128 up it is a memory saving, for
    about a third more output-layer FLOPs. See ``docs/models.md`` for figures.

    ``logit_softcap``: the logits are ``cap * tanh(hidden @ unembedding / cap)``, as the model's
    own forward computes them (``levanter.models.lm.final_logit_softcap``).

    ``vocab_block``: cut the *vocabulary* into blocks of this many words instead, each block scored
    for every token at once, with a running log-sum-exp (:func:`default_vocab_block`). The tokens'
    hidden states are then what each block reads again, not the whole unembedding: when the
    vocabulary is larger than the batch's tokens (a CPU batch of a 50k-word model), that moves
    several times fewer bytes. ``block_size`` is ignored then.
    """
    batch, seq_len, _ = hidden.shape
    if vocab_block is not None:
        return _vocab_streamed_loss(hidden, unembedding, tokens, loss_mask, z_loss_weight, logit_softcap, vocab_block)
    if block_size is None:
        block_size = default_block_size(unembedding.shape[-1])
    num_blocks, positions = position_blocks(seq_len, block_size // batch)
    pad = num_blocks * positions - seq_len

    targets, mask = _targets_and_mask(tokens, loss_mask)
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
    return _sums(lse, target_logits, mask, z_loss_weight)


# Logits per block of ``fused_next_token_loss``: on CPU about 4M (16 MiB in float32), a size that
# stays in cache; on accelerators 256M (1 GiB in float32: 2,048 tokens of a 128k vocabulary). Fewer,
# larger blocks matter there because the backward adds each block's [hidden, vocab] gradient into a
# float32 accumulator, a pass over memory per block: forward + backward at llama_600m's shape (16k
# tokens, hidden 1,024, vocabulary 128,256) took 145 ms on a TPU v5e with blocks of 523 tokens and
# 105 ms with 2,048 (bench/tpu_kernels.py --only loss); the step's peak memory did not change.
CPU_BLOCK_LOGITS = 1 << 22
# Logits per vocabulary block of the streamed loss on CPU (8 MiB in float32). Forward and backward
# of a 50,257-word output layer for 4 x 512 tokens, 2 cores, against token blocks of 83: hidden 64,
# 899 ms at 1,024 words a block, 936 at 2,048, 996 at 8,192, 992 with token blocks; hidden 128,
# 1,396 / 1,412 / 1,666 against 1,611.
CPU_VOCAB_BLOCK_LOGITS = 1 << 21
ACCELERATOR_BLOCK_LOGITS = 1 << 28


def default_block_size(vocab_size: int, num_devices: int = 1) -> int:
    """Tokens per block of ``fused_next_token_loss`` (all rows together) for this platform.

    ``num_devices`` is the number of devices the batch's rows are split over: each holds its
    share of a block's logits.
    """
    per_device = CPU_BLOCK_LOGITS if _platform() == "cpu" else ACCELERATOR_BLOCK_LOGITS
    return max(per_device * num_devices // vocab_size, 16)


def position_blocks(seq_len: int, most: int) -> tuple[int, int]:
    """``(blocks, positions per block)`` cutting ``seq_len`` positions into blocks of at most ``most``.

    The fewest blocks that split the sequence evenly, where such a split needs at most twice the
    fewest blocks of all; otherwise the fewest, of equal size, the sequence padded to fill them. An
    even split pads nothing and keeps each block aligned as the sequence is: 4,096 positions under a
    limit of 2,092 are two blocks of 2,048, where blocks of 2,092 would pad the sequence and cut it
    at positions a TPU's tiles do not line up with (it then copies the activations into a new layout
    both ways, in code as long as a layer's).
    """
    most = max(1, min(most, seq_len))
    fewest = -(-seq_len // most)
    for count in range(fewest, 2 * fewest + 1):
        if seq_len % count == 0:
            return count, seq_len // count
    return fewest, -(-seq_len // fewest)


def default_vocab_block(vocab_size: int, num_tokens: int) -> int | None:
    """Words per block of the vocabulary-streamed loss for ``num_tokens`` tokens per device, or
    ``None`` where the token blocks are the better cut: off the CPU (not measured there), and when
    there are at least as many tokens as words."""
    if _platform() != "cpu" or num_tokens >= vocab_size:
        return None
    return max(128, min(vocab_size, CPU_VOCAB_BLOCK_LOGITS // max(num_tokens, 1)))


def _platform() -> str:
    """Where the loss is being traced for: the active mesh's platform (a TPU mesh compiled for on a
    CPU machine is a TPU), else JAX's default backend."""
    from haliax.nn.attention_kernels import Platform

    return Platform.current().name


def _vocab_streamed_loss(hidden: jax.Array, unembedding: jax.Array, tokens: jax.Array, loss_mask: jax.Array,
                         z_loss_weight: float, cap: float | None, vocab_block: int) -> LossSums:
    batch, seq_len, embed = hidden.shape
    words = max(1, min(vocab_block, unembedding.shape[-1]))
    targets, mask = _targets_and_mask(tokens, loss_mask)
    # Rows and positions flattened (batch-major): a split of the batch over devices stays a split
    # of the rows.
    lse, target_logits = _streamed_lse_and_target(hidden.reshape(batch * seq_len, embed), unembedding,
                                                  targets.reshape(-1), words, cap)
    lse, target_logits = lse.reshape(batch, seq_len), target_logits.reshape(batch, seq_len)
    return _sums(lse, target_logits, mask, z_loss_weight)


def _word_blocks(vocab: int, words: int) -> tuple[int, int]:
    """How ``vocab`` words split into blocks of ``words``: the number of whole blocks, and the
    size of the last, shorter one (0 when ``words`` divides ``vocab``)."""
    return vocab // words, vocab % words


def _for_each_word_block(w: jax.Array, words: int, body, carry):
    """``carry = body(carry, w_block, first_word)`` over the vocabulary's blocks, in order.

    The whole blocks are dynamic slices of ``w`` [E, V] in a loop and the shorter last block a
    static slice after it: no block is padded, and ``w`` is neither copied nor transposed into
    blocks (at a 50k vocabulary those copies cost a tenth of the output layer's time on CPU).
    """
    whole, rest = _word_blocks(w.shape[-1], words)

    def step(index, carry):
        return body(carry, jax.lax.dynamic_slice_in_dim(w, index * words, words, axis=1), index * words)

    carry = jax.lax.fori_loop(0, whole, step, carry)
    if rest:
        carry = body(carry, w[:, whole * words:], whole * words)
    return carry


def _target_columns(w: jax.Array, targets: jax.Array) -> jax.Array:
    """Each token's target column of ``w`` [E, V], as a float32 [tokens, E]."""
    return jnp.take(w, targets, axis=1).T.astype(jnp.float32)


def _target_logits(x: jax.Array, w: jax.Array, targets: jax.Array, cap: float | None) -> jax.Array:
    """Each token's logit of its target (capped): the products of the operands summed in float32,
    as the blocks' matrix products sum them."""
    logit = jnp.sum(x.astype(jnp.float32) * _target_columns(w, targets), axis=-1)
    return logit if cap is None else cap * jnp.tanh(logit / cap)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _streamed_lse_and_target(x: jax.Array, w: jax.Array, targets: jax.Array, words: int,
                             cap: float | None) -> tuple[jax.Array, jax.Array]:
    """Per token: log-sum-exp of its logits and its target's logit. x: [tokens, E]; w: [E, V].

    The target's logit is one product per token, taken apart from the blocks, so that no block
    compares every word with the targets (forward) or adds a one-hot (backward).
    """

    def one_block(carry, w_block, first_word):
        running_max, scaled_sum = carry
        logits = _block_logits(x, w_block, cap)
        new_max = jnp.maximum(running_max, jnp.max(logits, axis=-1))
        scaled_sum = scaled_sum * jnp.exp(running_max - new_max) + jnp.sum(jnp.exp(logits - new_max[:, None]), axis=-1)
        return new_max, scaled_sum

    tokens = x.shape[0]
    start = (jnp.full((tokens,), -jnp.inf, jnp.float32), jnp.zeros((tokens,), jnp.float32))
    running_max, scaled_sum = _for_each_word_block(w, words, one_block, start)
    return running_max + jnp.log(scaled_sum), _target_logits(x, w, targets, cap)


def _streamed_forward(x, w, targets, words, cap):
    lse, target_logits = _streamed_lse_and_target(x, w, targets, words, cap)
    return (lse, target_logits), (x, w, targets, lse, target_logits)


def _streamed_backward(words, cap, residuals, cotangents):
    x, w, targets, lse, target_logits = residuals
    g_lse, g_target = cotangents

    def one_block(carry, w_block, first_word):
        dx, dw = carry
        logits = _block_logits(x, w_block, cap)
        dlogits = jnp.exp(logits - lse[:, None]) * g_lse[:, None]  # d lse / d logits = softmax
        if cap is not None:  # through cap * tanh(z / cap), whose derivative is 1 - (capped / cap)^2
            dlogits = dlogits * (1 - jnp.square(logits / cap))
        # Both products in the compute dtype (bfloat16 runs on the matrix units) with float32 sums.
        dlogits = dlogits.astype(x.dtype)
        dx = dx + jnp.dot(dlogits, w_block.astype(x.dtype).T, preferred_element_type=jnp.float32)
        dw_block = jnp.dot(x.T, dlogits, preferred_element_type=jnp.float32)
        return dx, jax.lax.dynamic_update_slice_in_dim(dw, dw_block, first_word, axis=1)

    start = (jnp.zeros(x.shape, jnp.float32), jnp.zeros(w.shape, jnp.float32))
    dx, dw = _for_each_word_block(w, words, one_block, start)
    # The target logits': d logit / d x = the target's column of w, d logit / d w = x in that column.
    g_target = g_target if cap is None else g_target * (1 - jnp.square(target_logits / cap))
    dx = dx + g_target[:, None] * _target_columns(w, targets)
    dw = dw.at[:, targets].add((g_target[:, None] * x.astype(jnp.float32)).T)
    return dx.astype(x.dtype), dw.astype(w.dtype), None


_streamed_lse_and_target.defvjp(_streamed_forward, _streamed_backward)


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
