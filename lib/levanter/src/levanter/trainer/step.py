"""The jitted train and eval steps.

The objective of one batch is ``sum over masked-in positions of (nll + z_loss_weight * logZ^2)``
divided by the batch's number of masked-in positions, plus the model's (already weighted)
auxiliary loss (:class:`NextTokenObjective`; other objectives plug in as an :class:`Objective`).
Microbatching splits the batch's rows, and because every microbatch's token sum is
divided by the *whole batch's* token count before its gradient is added, the accumulated gradient
equals the full-batch gradient exactly in real arithmetic, however the masked tokens fall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from levanter.trainer.bad_steps import BadStepRule, keep_if
from levanter.trainer.first_call_log import FirstCallLogged
from levanter.trainer.mixed_precision import cast_floating
from levanter.trainer.state import TrainState


@dataclass(frozen=True)
class DeviceBatch:
    """A ``levanter.data.Batch`` on device: a pytree the jitted step accepts (``extras``: its
    ``Batch.extras`` by name, None when it has none)."""

    tokens: jax.Array
    loss_mask: jax.Array
    segment_ids: jax.Array | None
    extras: dict[str, jax.Array] | None = None


jax.tree_util.register_dataclass(DeviceBatch, data_fields=["tokens", "loss_mask", "segment_ids", "extras"], meta_fields=[])


def token_loss_sums(logits, tokens, loss_mask):
    """(sum of masked nll, sum of masked logZ^2, number of masked-in positions), all f32."""
    from levanter.models.loss import next_token_loss

    loss_sum, weight_sum, z_sum = next_token_loss(logits, tokens, loss_mask, z_loss_weight=1.0)
    return loss_sum, z_sum, weight_sum


# The trainer picks the fused (blocked) cross-entropy by itself for speed up to this hidden size ...
# Output layer alone, forward and backward, 8 x 256 tokens, 2 pinned CPU cores, medians of 7
# (plain vs fused, ms): hidden 128 / vocab 50,257: 1,840 vs 1,160 (and 1.47 vs 0.66 GB peak);
# 256 / 50,257: 2,300 vs 2,030; 256 / 8,192: 414 vs 308; 512 / 50,257: 3,216 vs 3,660; 768 / 32,000:
# 2,650 vs 2,971. Up to 256 the blocks' logits stay in cache and that wins over the extra matmul.
FUSED_LOSS_MAX_HIDDEN = 256
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
      block of logits in cache for one extra matmul and wins (``llama_nano`` at 4 x 2048 tokens,
      hidden 128 to 256 with a 50k vocabulary); from hidden ~512 up the extra matmul costs more than
      it saves (the figures beside ``FUSED_LOSS_MAX_HIDDEN``, ``docs/models.md``).

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
    from levanter.models.lm import final_logit_softcap
    from levanter.models.loss import default_block_size, default_vocab_block, fused_next_token_loss

    with_metrics = getattr(model, "hidden_states_and_metrics", None)  # a model with metrics of its own (MoE)
    if with_metrics is None:
        (hidden, aux), metrics = model.hidden_states(batch.tokens, segment_ids=batch.segment_ids), None
    else:
        hidden, aux, metrics = with_metrics(batch.tokens, segment_ids=batch.segment_ids)
    unembedding = model.unembedding()
    block_size = default_block_size(unembedding.shape[-1], num_devices)
    vocab_block = default_vocab_block(unembedding.shape[-1], batch.tokens.size // max(num_devices, 1))
    sums = fused_next_token_loss(
        hidden, unembedding, batch.tokens, batch.loss_mask, z_loss_weight=1.0, block_size=block_size,
        logit_softcap=final_logit_softcap(model), vocab_block=vocab_block,
    )
    return (sums.loss_sum, sums.z_loss_sum, sums.weight_sum), aux, metrics


@dataclass(frozen=True)
class StepFunctions:
    train_step: Callable[..., tuple[TrainState, dict[str, jax.Array]]]  # (state, batch[, learning_rate])
    eval_step: Callable[..., tuple[jax.Array, jax.Array]]  # (params, batch[, frozen])


def _split_microbatches(batch: Any, num_microbatches: int) -> Any:
    """[B, ...] -> [k, B/k, ...], microbatch i = rows i, i+k, i+2k, ...

    Strided rather than contiguous rows: a batch sharded over devices in contiguous blocks then
    gives every microbatch rows from every device, so each pass still uses the whole mesh.
    """

    def split(x):
        if x is None:
            return None
        b = x.shape[0]
        return x.reshape(b // num_microbatches, num_microbatches, *x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(split, batch)


class Objective(Protocol):
    """What a train step minimises, in the pieces the step composes (see :func:`build_step_functions`).

    ``normaliser(batch)``: the count the batch's loss is a mean over (masked-in tokens, pairs...),
    fixed for the whole batch so that microbatch gradients add up to the full-batch one.
    ``precompute(build_model, params, frozen, batch)``: per-row values computed once per batch,
    before the batch is split into microbatches and outside the gradient (None when there are
    none). ``split(batch, context, k)``: ``k`` microbatches of both, stacked on a leading axis.
    ``loss(model, batch, context, normaliser, k)``: ``(value, sums)``, where ``value``'s gradient,
    summed over the ``k`` microbatches, is the batch's and ``sums`` is a tuple of scalars (or of
    pytrees of scalars) that add up over microbatches. ``metrics(sums, normaliser, k)``: the step's scalars; at least ``loss``,
    ``z_loss``, ``aux_loss``, ``total_loss`` and ``loss_tokens``. ``eval_sums(model, batch)``:
    ``(loss sum, weight sum)`` of one eval batch.
    """

    def normaliser(self, batch: DeviceBatch) -> jax.Array: ...

    def precompute(self, build_model: Callable[[Any, Any], Any], params: Any, frozen: Any, batch: DeviceBatch) -> Any: ...

    def split(self, batch: DeviceBatch, context: Any, num_microbatches: int) -> tuple[DeviceBatch, Any]: ...

    def loss(self, model: Any, batch: DeviceBatch, context: Any, normaliser: jax.Array, num_microbatches: int) -> tuple[jax.Array, tuple]: ...

    def metrics(self, sums: tuple, normaliser: jax.Array, num_microbatches: int) -> dict[str, jax.Array]: ...

    def eval_sums(self, model: Any, batch: DeviceBatch) -> tuple[jax.Array, jax.Array]: ...


@dataclass(frozen=True)
class NextTokenObjective:
    """The language-modelling objective of the module docstring (the default)."""

    z_loss_weight: float = 0.0
    fused_loss: bool | None = None
    num_devices: int = 1

    def _sums(self, model, batch: DeviceBatch):
        use_fused = prefers_fused_loss(model, batch.tokens.size, self.num_devices) if self.fused_loss is None else self.fused_loss
        if use_fused:
            (loss_sum, z_sum, weight_sum), aux, model_metrics = fused_token_loss_sums(model, batch, self.num_devices)
        else:
            out = model.forward(batch.tokens, segment_ids=batch.segment_ids)
            loss_sum, z_sum, weight_sum = token_loss_sums(out.logits, batch.tokens, batch.loss_mask)
            aux, model_metrics = out.aux_loss, getattr(out, "metrics", None)
        model_metrics = {name: jnp.asarray(v, jnp.float32) for name, v in (model_metrics or {}).items()}
        return loss_sum, z_sum, weight_sum, jnp.asarray(aux, jnp.float32), model_metrics

    def normaliser(self, batch: DeviceBatch) -> jax.Array:
        # The last position has no target inside the window and never counts (as in the loss).
        return jnp.maximum(jnp.sum(batch.loss_mask[:, :-1].astype(jnp.float32)), 1.0)

    def precompute(self, build_model, params, frozen, batch):
        return None

    def split(self, batch, context, num_microbatches):
        return _split_microbatches(batch, num_microbatches), None

    def loss(self, model, batch, context, normaliser, num_microbatches):
        loss_sum, z_sum, _, aux, model_metrics = self._sums(model, batch)
        value = (loss_sum + self.z_loss_weight * z_sum) / normaliser + aux / num_microbatches
        return value, (loss_sum, z_sum, aux, model_metrics)

    def metrics(self, sums, normaliser, num_microbatches):
        loss_sum, z_sum, aux, model_metrics = sums
        if num_microbatches > 1:
            aux = aux / num_microbatches
        loss = loss_sum / normaliser
        return {
            "loss": loss,
            "z_loss": z_sum / normaliser,
            "aux_loss": aux,
            "total_loss": loss + self.z_loss_weight * z_sum / normaliser + aux,
            "loss_tokens": normaliser,
            # The model's own (an MoE's moe/dropped_fraction): means over microbatches.
            **{name: value / num_microbatches for name, value in model_metrics.items()},
        }

    def eval_sums(self, model, batch):
        loss_sum, _, weight_sum, _, _ = self._sums(model, batch)
        return loss_sum, weight_sum


def build_step_functions(
    *,
    static_model: Any,
    optimizer: optax.GradientTransformation,
    lr_schedule: optax.Schedule,
    compute_dtype,
    z_loss_weight: float = 0.0,
    num_microbatches: int,
    state_shardings: Any = None,
    batch_sharding: Any = None,
    mesh_context: Callable[[], Any] | None = None,
    fused_loss: bool | None = None,
    learning_rate_input: bool = False,
    objective: Objective | None = None,
    train_model_transform: Callable[[Any, jax.Array], Any] | None = None,
    optimizer_needs_objective: bool = False,
    bad_step_rule: BadStepRule | None = None,
    ema_decay: float | None = None,
    ema_point: Callable[[Any, Any], Any] | None = None,
) -> StepFunctions:
    """``static_model`` is the model's part that is neither trained nor frozen arrays
    (``eqx.partition``'s second half); the step builds the model from it, the state's ``params``
    and the state's frozen arrays (``state.frozen.model``, when there are some).

    With shardings given, the step keeps parameters and optimizer state where they are (output
    shardings = input shardings) and lays each microbatch out like the batch. ``fused_loss``:
    compute the loss with ``fused_next_token_loss`` (True), from the logits (False), or by the rule
    of ``prefers_fused_loss`` (None, the default).

    ``objective``: what the step minimises (:class:`Objective`); by default the next-token loss
    with ``z_loss_weight`` and ``fused_loss``. Whatever the objective precomputes from the batch
    (a reference model's log-probabilities, say) is computed once per batch, before the
    microbatch loop.

    ``train_model_transform(model, key)``: applied to the model in the train step only (never in
    evaluation), with a key fresh for every step and microbatch: LoRA dropout
    (``levanter.lora.with_lora_dropout``). Without it the step is the same program as before.

    ``learning_rate_input``: the train step is ``train_step(state, batch, learning_rate)``, the
    rate of this step computed by the caller and handed to ``optimizer.update(...,
    learning_rate=)`` (optimizers built by ``levanter.optim`` accept it). The compiled step then
    holds no number of the schedule, so runs that differ only in length or learning rate share one
    program (and JAX's persistent compilation cache finds it). Otherwise the step computes
    ``lr_schedule(step)`` itself, for any optax optimizer.

    ``optimizer_needs_objective``: also hand ``optimizer.update`` this step's loss as a function of
    the parameters (``obj_fn=``, see ``OptimizerConfig.needs_objective``): the whole batch's, or on
    microbatched steps the first microbatch's times their number, so that a Hessian-vector product
    of it holds no more activations than one microbatch's gradient.

    ``bad_step_rule``: keep the parameters, the optimizer state and the weight average of a step it
    judges bad (:mod:`levanter.trainer.bad_steps`; the state's ``bad_steps`` holds its history) and
    report ``train/skipped_steps`` (1 for a skipped step) and ``train/skipped_steps_total``.
    ``ema_decay``: move the state's ``ema`` towards ``ema_point(params, opt_state)`` after each
    step (by default the parameters; the trainer passes the optimizer's evaluation point).
    """
    num_devices = 1 if batch_sharding is None else len(batch_sharding.device_set)

    def in_device_memory(opt_state):
        """The optimizer's state where the update can read it: state kept in the host's memory
        (``TrainerConfig.offload_optimizer_state``) is moved in; the step's output shardings move
        the new state back out."""
        if state_shardings is None:
            return opt_state
        return jax.tree.map(
            lambda x, s: jax.device_put(x, s.with_memory_kind("device")) if s.memory_kind not in (None, "device") else x,
            opt_state, state_shardings.opt_state,
        )
    if objective is None:
        objective = NextTokenObjective(z_loss_weight=z_loss_weight, fused_loss=fused_loss, num_devices=num_devices)

    def build_model(params, frozen):
        """The model in compute precision from trainable arrays and the state's frozen ones."""
        frozen_model = None if frozen is None else frozen.model
        if frozen_model is None:
            return eqx.combine(cast_floating(params, compute_dtype), static_model)
        return eqx.combine(cast_floating(params, compute_dtype), cast_floating(frozen_model, compute_dtype), static_model)

    def objective_value(params, frozen, batch: DeviceBatch, context, normaliser, key=None):
        model = build_model(params, frozen)
        if train_model_transform is not None:
            model = train_model_transform(model, key)
        return objective.loss(model, batch, context, normaliser, num_microbatches)

    grad_fn = jax.grad(objective_value, has_aux=True)

    def loss_of_params(frozen, batch: DeviceBatch, context, normaliser, transform_key):
        extra = (transform_key,) if train_model_transform is not None else ()
        if num_microbatches > 1:
            batch, context = jax.tree.map(lambda x: x[0], objective.split(batch, context, num_microbatches))
            extra = tuple(jax.random.split(k, num_microbatches)[0] for k in extra)
        return lambda params: num_microbatches * objective_value(params, frozen, batch, context, normaliser, *extra)[0]

    def step_with_rate(state: TrainState, batch: DeviceBatch, learning_rate: jax.Array | None):
        normaliser = objective.normaliser(batch)
        # Once per batch, before the microbatch loop; the objective keeps it out of the gradient.
        context = objective.precompute(build_model, state.params, state.frozen, batch)
        # The state's key advances as it always has; its second half feeds the model transform.
        key, transform_key = jax.random.split(state.key)
        if num_microbatches == 1:
            extra = (transform_key,) if train_model_transform is not None else ()
            grads, sums = grad_fn(state.params, state.frozen, batch, context, normaliser, *extra)
        else:
            micro = objective.split(batch, context, num_microbatches)
            if train_model_transform is not None:
                micro = (micro, jax.random.split(transform_key, num_microbatches))

            def accumulate(carry, mb):
                grads_acc, sums_acc = carry
                (mb_batch, mb_context), extra = (mb[0], (mb[1],)) if train_model_transform is not None else (mb, ())
                if batch_sharding is not None:
                    mb_batch = jax.lax.with_sharding_constraint(mb_batch, jax.tree.map(lambda _: batch_sharding, mb_batch))
                g, s = grad_fn(state.params, state.frozen, mb_batch, mb_context, normaliser, *extra)
                grads_acc = jax.tree.map(jnp.add, grads_acc, g)
                return (grads_acc, jax.tree.map(jnp.add, sums_acc, s)), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            first = jax.tree.map(lambda x: x[0], micro)
            (first_batch, first_context), first_extra = (first[0], (first[1],)) if train_model_transform is not None else (first, ())
            sums_shape = jax.eval_shape(lambda: grad_fn(state.params, state.frozen, first_batch, first_context, normaliser,
                                                        *first_extra)[1])
            init = (zeros, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape))
            (grads, sums), _ = jax.lax.scan(accumulate, init, micro)

        grad_norm = optax.tree.norm(grads)
        extra_args = {} if learning_rate is None else {"learning_rate": learning_rate}
        if optimizer_needs_objective:
            extra_args["obj_fn"] = loss_of_params(state.frozen, batch, context, normaliser, transform_key)
        updates, opt_state = optimizer.update(grads, in_device_memory(state.opt_state), state.params, **extra_args)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(objective.metrics(sums, normaliser, num_microbatches))
        metrics["grad_norm"] = grad_norm
        metrics["lr"] = lr_schedule(state.step) if learning_rate is None else learning_rate
        ema, bad_steps = state.ema, state.bad_steps
        if ema_decay is not None:
            target = params if ema_point is None else ema_point(params, opt_state)
            ema = jax.tree.map(lambda e, x: e + (1.0 - ema_decay) * (x - e), state.ema, target)
        if bad_step_rule is not None:
            good, bad_steps = bad_step_rule.judge(state.bad_steps, metrics["loss"], grad_norm)
            params, opt_state, ema = keep_if(good, (params, opt_state, ema), (state.params, in_device_memory(state.opt_state), state.ema))
            metrics["train/skipped_steps"] = (~good).astype(jnp.int32)
            metrics["train/skipped_steps_total"] = bad_steps.skipped
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state, key=key, frozen=state.frozen,
                               ema=ema, bad_steps=bad_steps)
        return new_state, metrics

    def eval_step(params, batch: DeviceBatch, frozen=None):
        return objective.eval_sums(build_model(params, frozen), batch)

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
        return StepFunctions(FirstCallLogged(jit_train, "the training step"), FirstCallLogged(jit_eval, "the evaluation step"))

    return StepFunctions(FirstCallLogged(UnderMesh(jit_train, mesh_context), "the training step"),
                         FirstCallLogged(UnderMesh(jit_eval, mesh_context), "the evaluation step"))


class UnderMesh:
    """A jitted function traced inside ``mesh_context()``: haliax's ``constrain`` reads the active
    mesh while tracing, so calling it and lowering it (ahead-of-time compilation) both happen there."""

    def __init__(self, jitted: Callable[..., Any], mesh_context: Callable[[], Any]):
        self._jitted = jitted
        self._mesh_context = mesh_context

    def __call__(self, *args):
        with self._mesh_context():
            return self._jitted(*args)

    def lower(self, *args):
        with self._mesh_context():
            return self._jitted.lower(*args)
