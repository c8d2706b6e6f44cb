"""Group relative policy optimisation (GRPO, Shao et al. 2024) and two of its published variants, as a
train-step objective.

A batch holds ``G`` sampled completions of each of its prompts, one per row (prompt then completion,
padded on the right), the loss mask on the completion's tokens. Each completion has a reward; its
*advantage* is its reward against its group's (:func:`group_advantages`, computed where the rewards
are). With ``logp`` the policy's log-probability of a completion token, ``old`` the sampler's (the
weights the completion was sampled with) and ``ref`` a frozen reference model's, all at the sampling
temperature (``log_softmax(logits / T)``), token ``t`` of completion ``i`` costs

    ratio = exp(logp - old)
    loss  = -min(ratio * A_i, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A_i) + kl_coef * kl
    kl    = ratio * (exp(ref - logp) - (ref - logp) - 1)

The bracket is Schulman's positive, unbiased estimate of KL(policy || ref) for a token drawn from the
policy; the token was drawn by the sampler, and the ratio reweighs it to the policy (DeepSeek-V3.2's
correction, which also makes its gradient the reverse KL's; ``unbiased_kl=False`` leaves it out, as
the original GRPO did).

and the variants differ in how the tokens' losses make the batch's:

- ``grpo``: each completion's mean over its tokens, then the mean over completions (the paper's);
- ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-like training"): the sum over all tokens divided
  by ``completions * max_completion_length``, a constant, so long and short completions weigh by
  their tokens, not by their count, and rewards are centred without dividing by the group's spread
  (``scale_rewards="none"``);
- ``dapo`` (Yu et al. 2025): the sum over all tokens divided by their number, with the upper clip
  raised (``epsilon_high=0.28``, "clip-higher") so unlikely tokens that earn reward can grow.

These are the conventions of TRL's ``GRPOTrainer`` (``loss_type`` ``grpo``, ``dr_grpo``, ``dapo``;
``scale_rewards`` ``group``, ``batch``, ``none``; ``beta`` is ``kl_coef``), and the tests check the
loss, the advantages and the gradient against it on the same batch. Since the sampler's
log-probabilities are the ``old`` ones, completions sampled by older weights (an asynchronous run's)
are corrected by the clipped ratio.

The reference's log-probabilities are computed once per batch, before the microbatch loop, from the
frozen copy of the weights training started from (``Trainer(keep_reference=True)``), as DPO's are.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from levanter.errors import LevanterError
from levanter.trainer.step import DeviceBatch, _split_microbatches, token_loss_sums

VARIANTS = ("grpo", "dr_grpo", "dapo")
REWARD_SCALES = ("group", "batch", "none")
# Added to the spread that divides centred rewards, so a group whose rewards barely differ gets
# large but finite advantages (TRL's constant).
ADVANTAGE_EPSILON = 1e-4
# The names of the per-token arrays a batch carries for this objective (``Batch.extras``).
SAMPLER_LOGPROBS = "sampler_logprobs"
ADVANTAGES = "advantages"


class GrpoConfigError(LevanterError, ValueError):
    """GRPO settings that cannot work."""


@dataclass(frozen=True)
class GrpoLoss:
    """How completions' rewards become a loss; see the module docstring. Use :func:`grpo`,
    :func:`dr_grpo` or :func:`dapo` for the published settings.

    ``measure_kl``: keep the frozen reference, and report the KL to it, even where ``kl_coef`` is 0
    (a copy of the trainable weights, and one more forward per batch).
    """

    variant: str = "grpo"
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: epsilon (symmetric clipping)
    kl_coef: float = 0.0
    scale_rewards: str = "group"
    measure_kl: bool = True
    unbiased_kl: bool = True

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise GrpoConfigError(f"GrpoLoss.variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}.")
        if self.scale_rewards not in REWARD_SCALES:
            raise GrpoConfigError(f"GrpoLoss.scale_rewards must be one of {', '.join(REWARD_SCALES)}, got {self.scale_rewards!r}.")
        for name in ("epsilon", "epsilon_high", "kl_coef"):
            value = getattr(self, name)
            if value is None and name == "epsilon_high":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise GrpoConfigError(f"GrpoLoss.{name} must be a finite number >= 0, got {value!r}.")

    @property
    def upper_epsilon(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0 or self.measure_kl


def grpo(*, epsilon: float = 0.2, kl_coef: float = 0.0, measure_kl: bool = True) -> GrpoLoss:
    """GRPO as published: per-completion token means, rewards scaled by their group's spread."""
    return GrpoLoss("grpo", epsilon=epsilon, kl_coef=kl_coef, measure_kl=measure_kl)


def dr_grpo(*, epsilon: float = 0.2, kl_coef: float = 0.0, measure_kl: bool = True) -> GrpoLoss:
    """Dr. GRPO: a constant normaliser (completions x longest allowed completion), rewards only centred."""
    return GrpoLoss("dr_grpo", epsilon=epsilon, kl_coef=kl_coef, scale_rewards="none", measure_kl=measure_kl)


def dapo(*, epsilon: float = 0.2, epsilon_high: float = 0.28, kl_coef: float = 0.0, measure_kl: bool = True) -> GrpoLoss:
    """DAPO's loss: a mean over every completion token of the batch, with the upper clip raised."""
    return GrpoLoss("dapo", epsilon=epsilon, epsilon_high=epsilon_high, kl_coef=kl_coef, measure_kl=measure_kl)


def group_advantages(rewards: np.ndarray, group_size: int, scale: str = "group") -> np.ndarray:
    """Each completion's advantage: its reward minus its group's mean, divided by the spread of the
    group's (``scale="group"``) or the batch's (``"batch"``) rewards plus :data:`ADVANTAGE_EPSILON`,
    or not divided (``"none"``).

    ``rewards`` is ``[groups * group_size]``, groups contiguous. A NaN reward (a completion whose
    reward could not be computed) is left out of the means and spreads and gets advantage 0. Spreads
    are sample standard deviations (divided by ``n - 1``), as TRL's are.
    """
    if scale not in REWARD_SCALES:
        raise GrpoConfigError(f"scale must be one of {', '.join(REWARD_SCALES)}, got {scale!r}.")
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim != 1 or rewards.size % group_size:
        raise GrpoConfigError(f"{rewards.size} rewards do not make groups of {group_size}.")
    grouped = rewards.reshape(-1, group_size)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # a group whose rewards all failed: NaN, advantage 0 below
        centred = (grouped - np.nanmean(grouped, axis=1, keepdims=True)).reshape(-1)
        if scale == "group":
            centred = centred / (np.repeat(_nan_sample_std(grouped, axis=1), group_size) + ADVANTAGE_EPSILON)
        elif scale == "batch":
            centred = centred / (_nan_sample_std(rewards, axis=None) + ADVANTAGE_EPSILON)
    return np.nan_to_num(centred, nan=0.0).astype(np.float32)


def _nan_sample_std(x: np.ndarray, axis: int | None) -> np.ndarray:
    count = np.sum(~np.isnan(x), axis=axis)
    variance = np.nanmean((x - np.nanmean(x, axis=axis, keepdims=axis is not None)) ** 2, axis=axis)
    return np.sqrt(variance * count / (count - 1))


def token_logprobs(model, batch: DeviceBatch, temperature: float) -> tuple[jax.Array, jax.Array]:
    """``([rows, seq_len - 1], same)`` float32: each position's log-probability of the next token and
    the entropy of its distribution, both at ``temperature``."""
    logits = model.forward(batch.tokens, segment_ids=batch.segment_ids).logits.astype(jnp.float32)[:, :-1] / temperature
    log_normaliser = jax.nn.logsumexp(logits, axis=-1)
    chosen = jnp.take_along_axis(logits, batch.tokens[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
    entropy = log_normaliser - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
    return chosen - log_normaliser, entropy


def token_losses(loss: GrpoLoss, logp, sampler_logp, advantages, reference_logp=None):
    """Per token: (loss, kl to the reference or None, clipped below, clipped above); see the module docstring."""
    ratio = jnp.exp(logp - sampler_logp)
    clipped = jnp.clip(ratio, 1 - loss.epsilon, 1 + loss.upper_epsilon)
    per_token = -jnp.minimum(ratio * advantages, clipped * advantages)
    kl = None
    if reference_logp is not None:
        kl = jnp.exp(reference_logp - logp) - (reference_logp - logp) - 1
        if loss.unbiased_kl:
            kl = kl * ratio
        if loss.kl_coef > 0:
            per_token = per_token + loss.kl_coef * kl
    low = (ratio < 1 - loss.epsilon) & (advantages < 0)
    high = (ratio > 1 + loss.upper_epsilon) & (advantages > 0)
    return per_token, kl, low, high


@dataclass(frozen=True)
class GrpoObjective:
    """The loss of :class:`GrpoLoss` as a :class:`levanter.trainer.step.Objective`.

    A batch carries, in ``extras``, :data:`SAMPLER_LOGPROBS` (the sampler's log-probability of each
    completion token, at ``temperature``) and :data:`ADVANTAGES` (each row's advantage, repeated
    along the row), aligned like the loss mask. ``max_completion_length`` is the sampler's token
    budget (Dr. GRPO's normaliser). A trainer running it keeps a reference when
    ``settings.needs_reference`` (``Trainer(keep_reference=...)``).
    """

    settings: GrpoLoss = GrpoLoss()
    temperature: float = 1.0
    max_completion_length: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise GrpoConfigError(f"temperature must be > 0 (the log-probabilities are those of logits / temperature), "
                                  f"got {self.temperature!r}.")
        if isinstance(self.max_completion_length, bool) or not isinstance(self.max_completion_length, int) or self.max_completion_length < 1:
            raise GrpoConfigError(f"max_completion_length must be a positive integer, got {self.max_completion_length!r}.")

    def normaliser(self, batch: DeviceBatch) -> jax.Array:
        rows = jnp.float32(batch.tokens.shape[0])
        if self.settings.variant == "grpo":
            return rows
        if self.settings.variant == "dr_grpo":
            return rows * self.max_completion_length
        return jnp.maximum(jnp.sum(batch.loss_mask[:, :-1].astype(jnp.float32)), 1.0)

    def precompute(self, build_model, params, frozen, batch: DeviceBatch):
        if not self.settings.needs_reference:
            return None
        if frozen is None:
            raise GrpoConfigError("This GRPO loss needs a reference model: train with Trainer(keep_reference=True).")
        reference = build_model(frozen.reference_params(params), frozen)
        return jax.lax.stop_gradient(token_logprobs(reference, batch, self.temperature)[0])

    def split(self, batch: DeviceBatch, context, num_microbatches: int):
        return _split_microbatches((batch, context), num_microbatches)

    def loss(self, model, batch: DeviceBatch, context, normaliser, num_microbatches: int):
        if batch.extras is None or SAMPLER_LOGPROBS not in batch.extras or ADVANTAGES not in batch.extras:
            raise GrpoConfigError(f"A GRPO batch carries extras {SAMPLER_LOGPROBS!r} and {ADVANTAGES!r} "
                                  "(levanter.data.Batch.extras); this one does not.")
        logp, entropy = token_logprobs(model, batch, self.temperature)
        mask = batch.loss_mask[:, :-1].astype(jnp.float32)
        per_token, kl, low, high = token_losses(
            self.settings, logp, batch.extras[SAMPLER_LOGPROBS][:, :-1], batch.extras[ADVANTAGES][:, :-1], context
        )
        if self.settings.variant == "grpo":
            objective = jnp.sum(jnp.sum(per_token * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0))
        else:
            objective = jnp.sum(per_token * mask)
        zero = jnp.float32(0)
        sums = {
            "objective": objective,
            "tokens": jnp.sum(mask),
            "kl": zero if kl is None else jnp.sum(kl * mask),
            "entropy": jnp.sum(jax.lax.stop_gradient(entropy) * mask),
            "clip_low": jnp.sum(low * mask),
            "clip_high": jnp.sum(high * mask),
        }
        return objective / normaliser, sums

    def metrics(self, sums, normaliser, num_microbatches: int):
        loss = sums["objective"] / normaliser
        tokens = jnp.maximum(sums["tokens"], 1.0)
        metrics = {
            "loss": loss,
            "policy/entropy": sums["entropy"] / tokens,
            "policy/clip_low": sums["clip_low"] / tokens,
            "policy/clip_high": sums["clip_high"] / tokens,
            "z_loss": jnp.float32(0),
            "aux_loss": jnp.float32(0),
            "total_loss": loss,
            "loss_tokens": sums["tokens"],  # the completion tokens trained on
        }
        if self.settings.needs_reference:
            metrics["policy/kl"] = sums["kl"] / tokens
        return metrics

    def eval_sums(self, model, batch: DeviceBatch):
        """The next-token loss on the masked positions (an eval set reads as masked text)."""
        out = model.forward(batch.tokens, segment_ids=batch.segment_ids)
        loss_sum, _, weight_sum = token_loss_sums(out.logits, batch.tokens, batch.loss_mask)
        return loss_sum, weight_sum


__all__ = [
    "ADVANTAGES", "ADVANTAGE_EPSILON", "GrpoConfigError", "GrpoLoss", "GrpoObjective", "SAMPLER_LOGPROBS", "dapo",
    "dr_grpo", "group_advantages", "grpo", "token_logprobs", "token_losses",
]
