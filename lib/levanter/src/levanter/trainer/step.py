"""The jitted train and eval steps.

The objective of one batch is ``sum over masked-in positions of (nll + z_loss_weight * logZ^2)``
divided by the batch's number of masked-in positions, plus the model's (already weighted)
auxiliary loss. Microbatching splits the batch's rows, and because every microbatch's token sum is
divided by the *whole batch's* token count before its gradient is added, the accumulated gradient
equals the full-batch gradient exactly in real arithmetic, however the masked tokens fall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from levanter.trainer.mixed_precision import cast_floating
from levanter.trainer.state import TrainState


@dataclass(frozen=True)
class DeviceBatch:
    """A ``levanter.data.Batch`` on device: a pytree the jitted step accepts."""

    tokens: jax.Array
    loss_mask: jax.Array
    segment_ids: jax.Array | None


jax.tree_util.register_dataclass(DeviceBatch, data_fields=["tokens", "loss_mask", "segment_ids"], meta_fields=[])


def token_loss_sums(logits, tokens, loss_mask):
    """(sum of masked nll, sum of masked logZ^2, number of masked-in positions), all f32."""
    from levanter.models.loss import next_token_loss

    loss_sum, weight_sum, z_sum = next_token_loss(logits, tokens, loss_mask, z_loss_weight=1.0)
    return loss_sum, z_sum, weight_sum


# The trainer picks the fused (blocked) cross-entropy by itself for speed up to this hidden size ...
FUSED_LOSS_MAX_HIDDEN = 64
# ... from this many logits per device and (micro)batch (32 MiB in float32): smaller logits stay in
# cache, where the plain loss has nothing to lose ...
FUSED_LOSS_MIN_LOGITS = 1 << 23
# ... and for memory, whatever the hidden size, once one device's float32 logits would take this
# much: the plain loss holds several [tokens, vocab] arrays at once (2.5x the float32 logits in a
# bfloat16 step on CPU), the blocked one a few blocks.
FUSED_LOSS_MIN_BYTES = 1 << 30


def prefers_fused_loss(model: Any, num_tokens: int, num_devices: int) -> bool:
    """Whether the train and eval steps compute the loss with ``fused_next_token_loss``.

    The model must expose ``hidden_states``/``unembedding`` (the decoder-only models do). Then,
    with ``num_tokens`` tokens per (micro)batch split over ``num_devices`` devices, the rule is:

    - memory: one device's [tokens, vocab] logits would take at least ``FUSED_LOSS_MIN_BYTES`` in
      float32 (a 128k vocabulary from 2,094 tokens per device). The blocked loss never holds more than
      a few blocks of logits, for about a third more output-layer FLOPs (~6% of a 1.4B Llama's step).
    - speed: the hidden size is at most ``FUSED_LOSS_MAX_HIDDEN`` and one device's logits hold at
      least ``FUSED_LOSS_MIN_LOGITS`` elements. With so narrow a hidden size the output layer's cost
      is the memory traffic of the large logits, not its matmul FLOPs; the fused loss keeps each
      block of logits in cache for one extra matmul and wins (``llama_nano`` at 4 x 2048 tokens);
      from hidden ~128 up the extra matmul costs more than it saves (``docs/models.md``,
      ``bench/attention_long_context.py``).

    Both give the same sums up to float rounding. The blocks keep the batch axis, so rows split
    over devices stay split.
    """
    if not (callable(getattr(model, "hidden_states", None)) and callable(getattr(model, "unembedding", None))):
        return False
    hidden, vocab = model.unembedding().shape
    logits_per_device = num_tokens * vocab / num_devices
    if 4 * logits_per_device >= FUSED_LOSS_MIN_BYTES:
        return True
    return hidden <= FUSED_LOSS_MAX_HIDDEN and logits_per_device >= FUSED_LOSS_MIN_LOGITS


def fused_token_loss_sums(model, batch: "DeviceBatch", num_devices: int = 1):
    """``token_loss_sums`` from the model's hidden states, without materialising the logits."""
    from levanter.models.loss import default_block_size, fused_next_token_loss

    hidden, aux = model.hidden_states(batch.tokens, segment_ids=batch.segment_ids)
    unembedding = model.unembedding()
    block_size = default_block_size(unembedding.shape[-1], num_devices)
    sums = fused_next_token_loss(hidden, unembedding, batch.tokens, batch.loss_mask, z_loss_weight=1.0, block_size=block_size)
    return (sums.loss_sum, sums.z_loss_sum, sums.weight_sum), aux


@dataclass(frozen=True)
class StepFunctions:
    train_step: Callable[..., tuple[TrainState, dict[str, jax.Array]]]  # (state, batch[, learning_rate])
    eval_step: Callable[[Any, DeviceBatch], tuple[jax.Array, jax.Array]]


def _split_microbatches(batch: DeviceBatch, num_microbatches: int) -> DeviceBatch:
    """[B, T] -> [k, B/k, T], microbatch i = rows i, i+k, i+2k, ...

    Strided rather than contiguous rows: a batch sharded over devices in contiguous blocks then
    gives every microbatch rows from every device, so each pass still uses the whole mesh.
    """

    def split(x):
        if x is None:
            return None
        b = x.shape[0]
        return x.reshape(b // num_microbatches, num_microbatches, *x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(split, batch)


def build_step_functions(
    *,
    static_model: Any,
    optimizer: optax.GradientTransformation,
    lr_schedule: optax.Schedule,
    compute_dtype,
    z_loss_weight: float,
    num_microbatches: int,
    state_shardings: Any = None,
    batch_sharding: Any = None,
    mesh_context: Callable[[], Any] | None = None,
    fused_loss: bool | None = None,
    learning_rate_input: bool = False,
) -> StepFunctions:
    """``static_model`` is the non-trainable part of the model (``eqx.partition``'s second half).

    With shardings given, the step keeps parameters and optimizer state where they are (output
    shardings = input shardings) and lays each microbatch out like the batch. ``fused_loss``:
    compute the loss with ``fused_next_token_loss`` (True), from the logits (False), or by the rule
    of ``prefers_fused_loss`` (None, the default).

    ``learning_rate_input``: the train step is ``train_step(state, batch, learning_rate)``, the
    rate of this step computed by the caller and handed to ``optimizer.update(...,
    learning_rate=)`` (optimizers built by ``levanter.optim`` accept it). The compiled step then
    holds no number of the schedule, so runs that differ only in length or learning rate share one
    program (and JAX's persistent compilation cache finds it). Otherwise the step computes
    ``lr_schedule(step)`` itself, for any optax optimizer.
    """
    num_devices = 1 if batch_sharding is None else len(batch_sharding.device_set)

    def forward_sums(params, batch: DeviceBatch):
        model = eqx.combine(cast_floating(params, compute_dtype), static_model)
        use_fused = prefers_fused_loss(model, batch.tokens.size, num_devices) if fused_loss is None else fused_loss
        if use_fused:
            (loss_sum, z_sum, weight_sum), aux = fused_token_loss_sums(model, batch, num_devices)
        else:
            out = model.forward(batch.tokens, segment_ids=batch.segment_ids)
            loss_sum, z_sum, weight_sum = token_loss_sums(out.logits, batch.tokens, batch.loss_mask)
            aux = out.aux_loss
        return loss_sum, z_sum, weight_sum, jnp.asarray(aux, jnp.float32)

    def objective(params, batch: DeviceBatch, total_weight):
        loss_sum, z_sum, _, aux = forward_sums(params, batch)
        value = (loss_sum + z_loss_weight * z_sum) / total_weight + aux / num_microbatches
        return value, (loss_sum, z_sum, aux)

    grad_fn = jax.grad(objective, has_aux=True)

    def step_with_rate(state: TrainState, batch: DeviceBatch, learning_rate: jax.Array | None):
        # The last position has no target inside the window and never counts (as in the loss).
        total_weight = jnp.maximum(jnp.sum(batch.loss_mask[:, :-1].astype(jnp.float32)), 1.0)
        if num_microbatches == 1:
            grads, (loss_sum, z_sum, aux) = grad_fn(state.params, batch, total_weight)
        else:
            micro = _split_microbatches(batch, num_microbatches)

            def accumulate(carry, mb):
                grads_acc, loss_acc, z_acc, aux_acc = carry
                if batch_sharding is not None:
                    mb = jax.lax.with_sharding_constraint(mb, jax.tree.map(lambda _: batch_sharding, mb))
                g, (l, z, a) = grad_fn(state.params, mb, total_weight)
                grads_acc = jax.tree.map(jnp.add, grads_acc, g)
                return (grads_acc, loss_acc + l, z_acc + z, aux_acc + a), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            init = (zeros, jnp.float32(0), jnp.float32(0), jnp.float32(0))
            (grads, loss_sum, z_sum, aux), _ = jax.lax.scan(accumulate, init, micro)
            aux = aux / num_microbatches

        grad_norm = optax.tree.norm(grads)
        given_rate = {} if learning_rate is None else {"learning_rate": learning_rate}
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params, **given_rate)
        params = optax.apply_updates(state.params, updates)
        key, _ = jax.random.split(state.key)
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state, key=key)
        loss = loss_sum / total_weight
        metrics = {
            "loss": loss,
            "z_loss": z_sum / total_weight,
            "aux_loss": aux,
            "total_loss": loss + z_loss_weight * z_sum / total_weight + aux,
            "grad_norm": grad_norm,
            "lr": lr_schedule(state.step) if learning_rate is None else learning_rate,
            "loss_tokens": total_weight,
        }
        return new_state, metrics

    def eval_step(params, batch: DeviceBatch):
        loss_sum, _, weight_sum, _ = forward_sums(params, batch)
        return loss_sum, weight_sum

    if learning_rate_input:

        def train_step(state: TrainState, batch: DeviceBatch, learning_rate: jax.Array):
            return step_with_rate(state, batch, learning_rate)

    else:

        def train_step(state: TrainState, batch: DeviceBatch):
            return step_with_rate(state, batch, None)

    if state_shardings is not None:
        # The learning rate is a scalar, laid out like the step counter (replicated).
        in_shardings = (state_shardings, batch_sharding) + ((state_shardings.step,) if learning_rate_input else ())
        jit_train = jax.jit(
            train_step,
            in_shardings=in_shardings,
            out_shardings=(state_shardings, None),
            donate_argnums=(0,),
        )
    else:
        jit_train = jax.jit(train_step, donate_argnums=(0,))
    # Eval batches may have another size than training ones; their layout comes with the inputs.
    jit_eval = jax.jit(eval_step)

    if mesh_context is None:
        return StepFunctions(jit_train, jit_eval)

    # haliax's constrain() reads the active mesh while tracing, so tracing must happen inside it.
    def with_mesh(fn):
        def run(*args):
            with mesh_context():
                return fn(*args)

        return run

    return StepFunctions(with_mesh(jit_train), with_mesh(jit_eval))
