"""Direct preference optimisation (DPO, Rafailov et al. 2023) as a train-step objective.

A batch holds preference pairs in adjacent rows: row ``2i`` is pair ``i``'s chosen reply, row
``2i + 1`` its rejected one, each with its loss mask on the reply's tokens
(:mod:`levanter.data.pairs`). With ``pi(y)`` the policy's summed log-probability of a reply's
tokens and ``ref(y)`` the reference model's, pair ``i`` contributes

    -log sigmoid(beta * ((pi(chosen) - ref(chosen)) - (pi(rejected) - ref(rejected))))

and the batch's loss is the mean over its pairs. ``beta * (pi(y) - ref(y))`` is the implicit reward
of ``y``; ``accuracy`` is the share of pairs whose chosen reply has the larger reward.

The reference model is the frozen copy of the weights training started from
(``FrozenArrays.reference``), or under LoRA the frozen base model with its adapters at zero. Its
log-probabilities are computed once per batch, in :meth:`DpoObjective.precompute`, which the step
calls before splitting the batch into microbatches, under ``stop_gradient``; the microbatch loop
only slices them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from levanter.errors import LevanterError
from levanter.trainer.step import DeviceBatch, _split_microbatches, token_loss_sums


class DpoConfigError(LevanterError, ValueError):
    """DPO settings that cannot work."""


@dataclass(frozen=True)
class DpoConfig:
    """``beta``: how far the policy may move from the reference (larger: stays closer)."""

    beta: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not (math.isfinite(self.beta) and self.beta > 0):
            raise DpoConfigError(f"DPO beta must be a finite number > 0, got {self.beta!r}.")


def sequence_logprobs(model, batch: DeviceBatch) -> jax.Array:
    """[rows] float32: each row's sum of ``log p(tokens[t + 1] | tokens[..t])`` over its masked-in positions."""
    logits = model.forward(batch.tokens, segment_ids=batch.segment_ids).logits.astype(jnp.float32)[:, :-1]
    targets = batch.tokens[:, 1:, None].astype(jnp.int32)
    logprobs = jnp.take_along_axis(logits, targets, axis=-1)[..., 0] - jax.nn.logsumexp(logits, axis=-1)
    return jnp.sum(logprobs * batch.loss_mask[:, :-1].astype(jnp.float32), axis=-1)


def dpo_terms(policy: jax.Array, reference: jax.Array, beta: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per pair: (loss, chosen reward, rejected reward), from per-row log-probabilities (chosen rows even)."""
    chosen = beta * (policy[0::2] - reference[0::2])
    rejected = beta * (policy[1::2] - reference[1::2])
    return -jax.nn.log_sigmoid(chosen - rejected), chosen, rejected


def _split_pairs(x, num_microbatches: int):
    """[2P, ...] -> [k, 2P/k, ...] keeping each pair's two rows together (pairs strided as rows are)."""
    pairs = x.reshape(x.shape[0] // 2, 2, *x.shape[1:])
    split = _split_microbatches(pairs, num_microbatches)
    return split.reshape(num_microbatches, -1, *x.shape[1:])


@dataclass(frozen=True)
class DpoObjective:
    """The DPO loss as a :class:`levanter.trainer.step.Objective` (needs a trainer with ``keep_reference=True``)."""

    beta: float = 0.1

    def normaliser(self, batch: DeviceBatch) -> jax.Array:
        return jnp.float32(batch.tokens.shape[0] // 2)

    def precompute(self, build_model, params, frozen, batch: DeviceBatch) -> jax.Array:
        if frozen is None:
            raise DpoConfigError("DPO needs a reference model: train with Trainer(keep_reference=True).")
        # Under LoRA there is no copy: the reference is the base model, the adapters set to zero.
        return jax.lax.stop_gradient(sequence_logprobs(build_model(frozen.reference_params(params), frozen), batch))

    def split(self, batch: DeviceBatch, context, num_microbatches: int):
        if (batch.tokens.shape[0] // 2) % num_microbatches:
            raise DpoConfigError(f"A batch of {batch.tokens.shape[0] // 2} pairs does not split into {num_microbatches} "
                                 "microbatches of whole pairs; make microbatch_size an even divisor of batch_size.")
        return jax.tree.map(lambda x: _split_pairs(x, num_microbatches), (batch, context))

    def loss(self, model, batch: DeviceBatch, context, normaliser, num_microbatches: int):
        losses, chosen, rejected = dpo_terms(sequence_logprobs(model, batch), context, self.beta)
        sums = (jnp.sum(losses), jnp.sum(chosen), jnp.sum(rejected), jnp.sum((chosen > rejected).astype(jnp.float32)))
        return sums[0] / normaliser, sums

    def metrics(self, sums, normaliser, num_microbatches: int):
        loss_sum, chosen_sum, rejected_sum, correct = sums
        loss = loss_sum / normaliser
        zero = jnp.float32(0)
        return {
            "loss": loss,
            "dpo_loss": loss,
            "rewards/chosen": chosen_sum / normaliser,
            "rewards/rejected": rejected_sum / normaliser,
            "rewards/margin": (chosen_sum - rejected_sum) / normaliser,
            "accuracy": correct / normaliser,
            "z_loss": zero,
            "aux_loss": zero,
            "total_loss": loss,
            "loss_tokens": normaliser,  # here: the number of pairs the loss is a mean over
        }

    def eval_sums(self, model, batch: DeviceBatch):
        """The next-token loss on the replies (an eval set of pairs reads as masked text)."""
        out = model.forward(batch.tokens, segment_ids=batch.segment_ids)
        loss_sum, _, weight_sum = token_loss_sums(out.logits, batch.tokens, batch.loss_mask)
        return loss_sum, weight_sum


__all__ = ["DpoConfig", "DpoConfigError", "DpoObjective", "dpo_terms", "sequence_logprobs"]
