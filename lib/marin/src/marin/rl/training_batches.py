"""Rollout batches as the trainer's data source: from the log when the run has trained them before,
else from the replay buffer, each turned into a ``levanter.data.Batch`` for the GRPO objective.

Each completion is one row: its prompt's tokens, then its own, padded on the right to ``seq_len``,
the loss mask on the positions that predict the completion's tokens (not on a completion whose
reward or sampling failed). The row's extras are the sampler's log-probability of each of those
tokens and the completion's advantage (:func:`levanter.trainer.grpo.group_advantages` over its group).
The batch's metrics are what the rollouts say about the policy: mean reward, pass rate, completion
length, failed rewards, staleness (how many steps older than the trained weights the sampling
weights were) and how fast the sampler went.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from levanter.data.batch import Batch
from levanter.trainer.grpo import ADVANTAGES, SAMPLER_LOGPROBS, group_advantages
from marin.errors import MarinError
from marin.rl.replay_buffer import ReplayBuffer
from marin.rl.rollout_log import RolloutLog
from marin.rl.rollouts import RolloutBatch

# How long the trainer waits for one batch before calling the samplers stuck.
TAKE_TIMEOUT_S = 3600.0


class RolloutLayoutError(MarinError, ValueError):
    """A rollout that does not fit the batch layout (a prompt longer than the run allows)."""


@dataclass(frozen=True)
class BatchLayout:
    group_size: int
    seq_len: int
    scale_rewards: str = "group"


def training_batch(batch: RolloutBatch, layout: BatchLayout) -> Batch:
    """Rows, mask, extras and metrics of one rollout batch (see the module docstring)."""
    completions = batch.completions
    rows = len(completions)
    tokens = np.zeros((rows, layout.seq_len), np.int32)
    mask = np.zeros((rows, layout.seq_len), np.float32)
    sampler = np.zeros((rows, layout.seq_len), np.float32)
    rewards = np.asarray([c.reward if c.trainable else np.nan for c in completions], np.float64)
    advantages = group_advantages(rewards, layout.group_size, layout.scale_rewards)
    row = 0
    for group in batch.groups:
        prompt = group.prompt_tokens
        for completion in group.completions:
            length = len(prompt) + len(completion.tokens)
            if length > layout.seq_len:
                raise RolloutLayoutError(
                    f"a completion of {group.prompt!r} needs {length} positions but rows hold {layout.seq_len}; the prompt "
                    "is longer than the environment's training prompts measured when the run started"
                )
            tokens[row, :length] = prompt + completion.tokens
            if completion.trainable:
                span = slice(len(prompt) - 1, length - 1)  # positions that predict the completion's tokens
                mask[row, span] = 1.0
                sampler[row, span] = completion.logprobs
            row += 1
    extras = {SAMPLER_LOGPROBS: sampler, ADVANTAGES: np.repeat(advantages[:, None], layout.seq_len, axis=1)}
    return Batch(tokens=tokens, loss_mask=mask, extras=extras, metrics=rollout_metrics(batch, rewards, layout))


def rollout_metrics(batch: RolloutBatch, rewards: np.ndarray, layout: BatchLayout) -> dict[str, float]:
    completions = batch.completions
    scored = rewards[~np.isnan(rewards)]
    grouped = rewards.reshape(-1, layout.group_size)
    # A group whose rewards are all equal (all right, all wrong) teaches nothing: every advantage is 0.
    flat = [np.nanmax(g) == np.nanmin(g) if not np.all(np.isnan(g)) else True for g in grouped]
    return {
        "reward/mean": float(scored.mean()) if scored.size else 0.0,  # with reward/failures saying why
        "reward/pass_rate": float(np.mean([c.passed for c in completions])),
        "reward/failures": float(sum(not c.trainable for c in completions)),
        "reward/groups_without_signal": float(np.mean(flat)),
        "rollout/response_length": float(np.mean([len(c.tokens) for c in completions])),
        "rollout/truncated": float(np.mean([c.finish == "length" for c in completions])),
        "rollout/weights_version": float(batch.weights_version),
        "rollout/staleness": float(batch.index - batch.weights_version),
        "rollout/tokens_per_second": batch.generated_tokens / batch.seconds if batch.seconds > 0 else float("nan"),
    }


class RolloutBatches:
    """The trainer's data source (``iter_from(k)`` yields the batch of step ``k + 1``, then on): see
    :mod:`marin.rl.rollout_log` for why a resumed run loses no rollout and repeats none."""

    def __init__(self, buffer: ReplayBuffer, log: RolloutLog, layout: BatchLayout, num_steps: int):
        self.buffer = buffer
        self.log = log
        self.layout = layout
        self.num_steps = num_steps
        self.reused = 0  # batches read back from the log by this run

    def iter_from(self, start_step: int) -> Iterator[Batch]:
        logged_until = self.log.first_missing(start_step)
        self.buffer.open(first_to_sample=logged_until, first_to_take=start_step)
        try:
            for index in range(start_step, self.num_steps):
                if index < logged_until:
                    batch = self.log.read(index)
                    self.reused += 1
                    self.buffer.skip_to(index + 1)
                else:
                    batch = self.buffer.take(index, timeout=TAKE_TIMEOUT_S)
                    self.log.write(batch)  # before it is trained on: a resumed run finds it here
                yield training_batch(batch, self.layout)
        finally:
            self.buffer.close()


__all__ = ["BatchLayout", "RolloutBatches", "RolloutLayoutError", "rollout_metrics", "training_batch"]
