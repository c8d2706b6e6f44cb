"""What a reinforcement-learning run learns from: problems (prompts) and a reward that checks a completion.

An :class:`Environment` is a frozen dataclass with two methods, ``problems(split)`` and
``reward(problem, completion)``; its class name and fields are part of the RL step's identity, so
the same environment anywhere makes the same step. A problem is a prompt and the answer the reward
checks against. Rewards are numbers, usually 0 or 1 (right or wrong); a completion *passes* when
its reward reaches 1, unless the environment says otherwise (:meth:`Environment.score`).

Problems are generated or listed offline: nothing is downloaded. The built-in ones are
:class:`~marin.rl.arithmetic.ArithmeticEnvironment`, :class:`~marin.rl.word_lists.WordListEnvironment`
and :class:`FormatReward`, which adds a reward for the shape of a completion to another environment's.
A reward that raises, hangs or returns something that is not a finite number fails only its own
completion (:mod:`marin.rl.rewards`).
"""

from __future__ import annotations

import abc
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass

from marin.errors import MarinError

SPLITS = ("train", "eval")


class EnvironmentConfigError(MarinError, ValueError):
    """An environment that cannot be used as written (no problems, an unknown split, a bad setting)."""


@dataclass(frozen=True)
class Problem:
    """One prompt, and what its reward needs to check a completion (the expected answer)."""

    prompt: str
    answer: str = ""


@dataclass(frozen=True)
class Score:
    """A completion's reward and whether it passed; ``failure`` says why the reward could not be computed."""

    reward: float
    passed: bool
    failure: str | None = None


class Environment(abc.ABC):
    """Problems with a verifiable reward; subclass it as a ``@dataclass(frozen=True)``.

    ``problems("train")`` are sampled for training, ``problems("eval")`` are held out to measure the
    pass rate; both must be the same every time they are asked for (generate them from a seed).
    """

    @abc.abstractmethod
    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of ``split`` ("train" or "eval")."""

    @abc.abstractmethod
    def reward(self, problem: Problem, completion: str) -> float:
        """The reward of ``completion`` (the text the model wrote after the prompt)."""

    def score(self, problem: Problem, completion: str) -> Score:
        """The reward, and whether it passed (reward >= 1). Override to pass by another rule."""
        reward = self.reward(problem, completion)
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise TypeError(f"reward() returned {type(reward).__name__} {reward!r}, not a number")
        return Score(float(reward), float(reward) >= 1.0)


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise EnvironmentConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}.")


@dataclass(frozen=True)
class FormatReward(Environment):
    """``environment``'s problems and reward, plus ``weight`` for a completion that matches ``pattern``
    (a regular expression, matched against the whole stripped completion).

    A small reward for the shape of an answer (a number, ``<answer>...</answer>``) gives a model that
    is rarely right something to learn from; passing is still ``environment``'s to decide.
    """

    environment: Environment
    pattern: str
    weight: float = 0.1

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as error:
            raise EnvironmentConfigError(f"FormatReward.pattern {self.pattern!r} is not a regular expression: {error}.") from None

    def problems(self, split: str) -> Sequence[Problem]:
        return self.environment.problems(split)

    def reward(self, problem: Problem, completion: str) -> float:
        return self.score(problem, completion).reward

    def formatted(self, completion: str) -> bool:
        return re.fullmatch(self.pattern, completion.strip()) is not None

    def score(self, problem: Problem, completion: str) -> Score:
        inner = self.environment.score(problem, completion)
        bonus = self.weight if self.formatted(completion) else 0.0
        return Score(inner.reward + bonus, inner.passed)


__all__ = ["Environment", "EnvironmentConfigError", "FormatReward", "Problem", "SPLITS", "Score", "check_split"]
