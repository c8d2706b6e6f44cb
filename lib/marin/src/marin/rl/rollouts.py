"""Rollouts: completions sampled for a batch of problems, scored, with the weights version that sampled them.

A :class:`RolloutBatch` is everything one training step learns from: for each of its problems a
:class:`RolloutGroup` of completions sampled from the same prompt, each with its tokens, the
sampler's log-probability of every token (at the sampling temperature), its text and its score. The
batch records ``weights_version``, the number of training steps behind the weights that sampled it,
so the trainer knows how stale it is. Batches are plain data: they travel between processes and are
written to the run's rollout log (:mod:`marin.rl.rollout_log`) as JSON a person can read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from marin.errors import MarinError


class RolloutConfigError(MarinError, ValueError):
    """Sampling settings that cannot work."""


@dataclass(frozen=True)
class RolloutSampling:
    """How completions are sampled: ``temperature`` (> 0: a policy learns from its own randomness),
    ``top_p`` and ``top_k`` (1 and 0: off), and at most ``max_tokens`` tokens per completion, the
    end-of-text token included."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0 and math.isfinite(self.temperature)):
            raise RolloutConfigError(f"temperature must be a finite number > 0 (sampling, not greedy), got {self.temperature!r}.")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise RolloutConfigError(f"top_p must be in (0, 1], got {self.top_p!r}.")
        for name in ("top_k", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "max_tokens" else 0):
                raise RolloutConfigError(f"{name} must be an integer >= {1 if name == 'max_tokens' else 0}, got {value!r}.")


@dataclass(frozen=True)
class Completion:
    tokens: list[int]  # as sampled; ends with the end-of-text token when the model stopped
    logprobs: list[float]  # the sampler's, one per token, at the sampling temperature
    text: str  # the tokens before the end-of-text token, decoded: what the reward read
    reward: float  # NaN when the reward failed
    passed: bool
    finish: str  # "stop" (end-of-text), "length" (max_tokens) or "error"
    failure: str | None = None  # why the reward (or the sampling) failed

    @property
    def trainable(self) -> bool:
        """Whether training may learn from it: it was sampled and scored."""
        return self.failure is None and self.finish != "error" and bool(self.tokens)


@dataclass(frozen=True)
class RolloutGroup:
    problem: int  # index into the environment's training problems
    prompt: str
    prompt_tokens: list[int]
    completions: list[Completion]


@dataclass(frozen=True)
class RolloutBatch:
    index: int  # trained at step index + 1
    weights_version: int  # the weights after this many training steps sampled it
    groups: list[RolloutGroup]
    seconds: float  # sampling and scoring time
    generated_tokens: int = 0
    worker: str = ""  # which rollout worker made it (for the log)

    @property
    def completions(self) -> list[Completion]:
        return [completion for group in self.groups for completion in group.completions]

    def to_json(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        for group in record["groups"]:  # JSON has no NaN: a failed reward is written as null
            for completion in group["completions"]:
                if not math.isfinite(completion["reward"]):
                    completion["reward"] = None
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> RolloutBatch:
        groups = []
        for group in record["groups"]:
            completions = [Completion(**{**c, "reward": float("nan") if c["reward"] is None else c["reward"]})
                           for c in group["completions"]]
            groups.append(RolloutGroup(**{**group, "completions": completions}))
        return cls(**{**record, "groups": groups})


__all__ = ["Completion", "RolloutBatch", "RolloutConfigError", "RolloutGroup", "RolloutSampling"]
