"""The held-out pass rate: the share of an environment's ``eval`` problems a model answers right, greedily.

Greedy decoding (temperature 0) makes the figure a property of the weights, not of a draw. During an
RL run it is logged as ``heldout/pass_rate`` (and ``heldout/reward``) at step 0, every ``eval_every``
steps and after the last (:class:`HeldOutEvaluation`, the trainer's ``ModelEvaluation``);
:func:`heldout_pass_rate` measures any saved model the same way, e.g. the SFT model an RL run starts
from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from levanter.inference.engine import EngineConfig, GenerationEngine
from levanter.tokenization import HfTokenizer, load_tokenizer
from levanter.trainer.hooks import ModelEvaluation
from levanter.trainer.mixed_precision import resolve_compute_dtype
from marin.rl.environments import Environment, Problem
from marin.rl.policy_weights import sampling_copy
from marin.rl.rewards import RewardScorer
from marin.rl.rollout_worker import encode_prompt, generation_params, scored_completion
from marin.rl.rollouts import Completion, RolloutSampling


class HeldOutEvaluation:
    """Greedy completions of the held-out problems, scored; one engine, handed each model to evaluate."""

    def __init__(self, environment: Environment, tokenizer: HfTokenizer, sampling: RolloutSampling, *,
                 compute_dtype: str = "auto", reward_timeout_s: float = 10.0, max_batch: int = 64):
        self.problems: Sequence[Problem] = list(environment.problems("eval"))
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.scorer = RewardScorer(environment, timeout_s=reward_timeout_s)
        self.dtype = resolve_compute_dtype(compute_dtype)
        self.max_batch = max_batch
        self._engine: GenerationEngine | None = None

    def completions(self, model: Any) -> list[Completion]:
        model = sampling_copy(model, self.dtype)
        if self._engine is None:
            self._engine = GenerationEngine(model, EngineConfig(max_batch=self.max_batch)).start()
        else:
            self._engine.set_model(model)
        prompts = [encode_prompt(self.tokenizer, problem.prompt) for problem in self.problems]
        generations = self._engine.generate(prompts, generation_params(self.sampling, self.tokenizer, seed=0, greedy=True))
        return [scored_completion(g, self.tokenizer, self.scorer, problem, f"held-out problem {i}")
                for i, (g, problem) in enumerate(zip(generations, self.problems))]

    def evaluate(self, model: Any, step: int) -> dict[str, float]:
        completions = self.completions(model)
        rewards = [c.reward for c in completions if c.failure is None]
        return {"pass_rate": float(np.mean([c.passed for c in completions])),
                "reward": float(np.mean(rewards)) if rewards else 0.0}

    def model_evaluation(self, every: int | None) -> ModelEvaluation:
        return ModelEvaluation("heldout", self.evaluate, every=every, at_start=True)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def heldout_pass_rate(hf_folder: str, environment: Environment, *, max_tokens: int = 16, tokenizer: str | None = None) -> float:
    """The held-out pass rate of the Hugging Face model in ``hf_folder`` (its tokenizer beside it unless given)."""
    from levanter.compat.hf_checkpoints import import_from_hf

    evaluation = HeldOutEvaluation(environment, load_tokenizer(tokenizer or hf_folder), RolloutSampling(max_tokens=max_tokens))
    try:
        return evaluation.evaluate(import_from_hf(hf_folder), 0)["pass_rate"]
    finally:
        evaluation.close()


__all__ = ["HeldOutEvaluation", "heldout_pass_rate"]
