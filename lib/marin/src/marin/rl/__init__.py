"""Reinforcement learning from verifiable rewards: ``rl_train(...)`` improves a model on an environment's
rewards with a GRPO-family loss, sampling with the inference engine and training with the trainer.

An environment is a frozen dataclass with ``problems(split)`` and ``reward(problem, completion)``
(:mod:`marin.rl.environments`); arithmetic, word-list and format rewards are built in. The losses are
:func:`grpo`, :func:`dr_grpo` and :func:`dapo` (:mod:`levanter.trainer.grpo`). See docs/post-training.md.
"""

from levanter.trainer.grpo import GrpoLoss, dapo, dr_grpo, grpo
from marin.rl.arithmetic import ArithmeticEnvironment
from marin.rl.environments import Environment, EnvironmentConfigError, FormatReward, Problem, Score
from marin.rl.evaluation import heldout_pass_rate
from marin.rl.rl_run import RlConfigError
from marin.rl.rl_train import RlTrainedModel, rl_train
from marin.rl.rollouts import RolloutSampling
from marin.rl.word_lists import WordListEnvironment

__all__ = [
    "ArithmeticEnvironment", "Environment", "EnvironmentConfigError", "FormatReward", "GrpoLoss", "Problem",
    "RlConfigError", "RlTrainedModel", "RolloutSampling", "Score", "WordListEnvironment", "dapo", "dr_grpo", "grpo",
    "heldout_pass_rate", "rl_train",
]
