"""A rollout worker: samples completions of the environment's problems with the latest weights it was
sent, and scores them.

A worker holds one :class:`~levanter.inference.engine.GenerationEngine` (continuous batching over a
paged key/value cache), built when the first weights arrive and handed each later version with
``set_model``, so the compiled programs serve every version. For batch ``index`` it samples
``group_size`` completions of each problem it is given, each with its own seed drawn from the run's
seed, the batch and the completion's place in it: whoever samples a batch, with the same weights,
samples the same tokens. Every completion runs to the end-of-text token (kept, with its
log-probability, since the policy must learn when to stop) or to ``max_tokens``.

The worker is an ordinary class; :mod:`marin.rl.rollout_fleet` places it through fray, in the
trainer's process or another, and calls its methods remotely.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from levanter.inference.engine import EngineConfig, FinishReason, Generation, GenerationEngine, GenerationParams
from levanter.tokenization import HfTokenizer, load_tokenizer
from levanter.trainer.mixed_precision import resolve_compute_dtype
from marin.rl.environments import Environment, Problem
from marin.rl.policy_weights import model_from_weights, model_skeleton
from marin.rl.rewards import RewardScorer
from marin.rl.rollouts import Completion, RolloutBatch, RolloutGroup, RolloutSampling

_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


@dataclass(frozen=True)
class RolloutWorkerConfig:
    model: Any  # the model config: model.build(vocab_size, key=...)
    vocab_size: int
    tokenizer: str  # where the tokenizer lies (a folder, a tokenizer.json, a URL)
    environment: Environment
    sampling: RolloutSampling
    group_size: int
    seed: int = 0
    compute_dtype: str = "auto"
    reward_timeout_s: float = 10.0
    max_batch: int = 64  # completions sampled at once


def encode_prompt(tokenizer: HfTokenizer, prompt: str) -> list[int]:
    """The prompt's tokens, after the tokenizer's BOS when it has one (as text was trained with)."""
    ids = tokenizer.tokenizer.encode(prompt, add_special_tokens=False).ids
    return ids if tokenizer.bos_id is None else [tokenizer.bos_id, *ids]


def problems_of_batch(index: int, per_batch: int, num_problems: int, run_seed: int) -> list[int]:
    """The training problems batch ``index`` samples: the run goes through the problems in passes, each
    pass in its own seeded order, so every problem is seen once per pass and any batch is found alone."""
    picked = []
    for position in range(index * per_batch, (index + 1) * per_batch):
        epoch, offset = divmod(position, num_problems)
        order = np.random.default_rng([run_seed, epoch]).permutation(num_problems)
        picked.append(int(order[offset]))
    return picked


def completion_seed(run_seed: int, index: int, slot: int, sample: int) -> int:
    """The sampling seed of completion ``sample`` of problem ``slot`` of batch ``index``."""
    return int(np.random.SeedSequence([run_seed, index, slot, sample]).generate_state(1)[0])


def generation_params(sampling: RolloutSampling, tokenizer: HfTokenizer, *, seed: int, greedy: bool = False) -> GenerationParams:
    stop = () if tokenizer.eos_id is None else (tokenizer.eos_id,)
    return GenerationParams(
        max_tokens=sampling.max_tokens, temperature=0.0 if greedy else sampling.temperature, top_k=sampling.top_k,
        top_p=sampling.top_p, seed=seed, stop_ids=stop, report_stop=True, logprobs_at_temperature=True,
    )


def completion_text(tokenizer: HfTokenizer, tokens: Sequence[int]) -> str:
    """What the reward reads: the tokens before the end-of-text token, decoded."""
    if tokens and tokenizer.eos_id is not None and tokens[-1] == tokenizer.eos_id:
        tokens = tokens[:-1]
    return tokenizer.tokenizer.decode(list(tokens), skip_special_tokens=True)


def scored_completion(generation: Generation, tokenizer: HfTokenizer, scorer: RewardScorer, problem: Problem,
                      label: str) -> Completion:
    finish = _FINISH.get(generation.finish_reason, "error")
    tokens = list(generation.tokens)
    logprobs = [lp.logprob for lp in generation.logprobs]
    text = completion_text(tokenizer, tokens)
    if finish == "error":
        return Completion(tokens, logprobs, text, float("nan"), False, finish, f"sampling failed: {generation.message}")
    score = scorer.score(problem, text, label=label)
    return Completion(tokens, logprobs, text, score.reward, score.passed, finish, score.failure)


class RolloutWorker:
    """Samples and scores rollout batches; see the module docstring."""

    def __init__(self, config: RolloutWorkerConfig):
        self.config = config
        self.tokenizer = load_tokenizer(config.tokenizer)
        self.problems = list(config.environment.problems("train"))
        self.scorer = RewardScorer(config.environment, timeout_s=config.reward_timeout_s)
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._skeleton = model_skeleton(config.model, config.vocab_size)
        self._dtype = resolve_compute_dtype(config.compute_dtype)
        self._engine: GenerationEngine | None = None
        self.version: int | None = None

    def set_weights(self, version: int, arrays: Any) -> None:
        model = model_from_weights(self._skeleton, arrays, self._dtype)
        if self._engine is None:
            self._engine = GenerationEngine(model, EngineConfig(max_batch=self.config.max_batch)).start()
        else:
            self._engine.set_model(model)
        self.version = version

    def rollout(self, index: int, problem_ids: Sequence[int]) -> RolloutBatch:
        """Batch ``index``: ``group_size`` scored completions of each of ``problem_ids``."""
        if self._engine is None or self.version is None:
            raise RuntimeError("rollout before set_weights: a worker samples only with weights it was sent")
        started = time.monotonic()
        cfg = self.config
        prompts, params = [], []
        for slot, problem_id in enumerate(problem_ids):
            tokens = encode_prompt(self.tokenizer, self.problems[problem_id].prompt)
            for sample in range(cfg.group_size):
                prompts.append(tokens)
                params.append(generation_params(cfg.sampling, self.tokenizer, seed=completion_seed(cfg.seed, index, slot, sample)))
        generations = self._engine.generate(prompts, params)
        groups = []
        for slot, problem_id in enumerate(problem_ids):
            problem = self.problems[problem_id]
            mine = generations[slot * cfg.group_size:(slot + 1) * cfg.group_size]
            completions = [scored_completion(g, self.tokenizer, self.scorer, problem, f"batch {index}, problem {problem_id}, "
                                                                                       f"sample {i}") for i, g in enumerate(mine)]
            groups.append(RolloutGroup(problem_id, problem.prompt, prompts[slot * cfg.group_size], completions))
        return RolloutBatch(index=index, weights_version=self.version, groups=groups, seconds=time.monotonic() - started,
                            generated_tokens=sum(len(g.tokens) for g in generations), worker=self.name)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


__all__ = ["RolloutWorker", "RolloutWorkerConfig", "completion_seed", "problems_of_batch", "completion_text", "encode_prompt", "generation_params",
           "scored_completion"]
