"""A string task: reverse or sort a list of words, rewarded by exact match.

``"reverse: sun cat map ="`` wants ``"map cat sun"``; ``"sort: sun cat map ="`` wants ``"cat map
sun"``. Word lists are drawn from a seed without repeats and split into held-out and training
problems as the arithmetic ones are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from marin.rl.environments import Environment, EnvironmentConfigError, Problem, check_split

TASKS = ("reverse", "sort")
WORDS = (
    "ant", "bee", "cat", "cow", "dog", "egg", "elk", "fig", "fox", "hat", "hen", "ink", "jam", "key", "map",
    "nut", "owl", "pig", "rat", "sun", "toy", "van", "web", "yak",
)


@dataclass(frozen=True)
class WordListEnvironment(Environment):
    """Lists of ``min_words`` to ``max_words`` distinct words from ``words``, to ``task`` ("reverse" or
    "sort"); a completion earns 1 when its words, split on whitespace, are the answer's."""

    task: str = "reverse"
    words: tuple[str, ...] = WORDS
    min_words: int = 2
    max_words: int = 4
    num_train: int = 1000
    num_eval: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise EnvironmentConfigError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}.")
        if not 1 <= self.min_words <= self.max_words <= len(self.words):
            raise EnvironmentConfigError(
                f"need 1 <= min_words <= max_words <= {len(self.words)} (the number of words), got {self.min_words} "
                f"and {self.max_words}."
            )
        if any(not word or any(c.isspace() for c in word) for word in self.words) or len(set(self.words)) != len(self.words):
            raise EnvironmentConfigError("words must be distinct, non-empty and without whitespace.")
        if self.num_train < 1 or self.num_eval < 0:
            raise EnvironmentConfigError(f"num_train must be >= 1 and num_eval >= 0, got {self.num_train} and {self.num_eval}.")

    @cached_property
    def _drawn(self) -> list[Problem]:
        rng = np.random.default_rng(self.seed)
        wanted = self.num_eval + self.num_train
        seen: set[tuple[str, ...]] = set()
        problems = []
        for _ in range(50 * wanted):  # a bounded search: a small vocabulary refuses, never spins
            count = int(rng.integers(self.min_words, self.max_words + 1))
            drawn = tuple(self.words[i] for i in rng.choice(len(self.words), size=count, replace=False))
            if drawn in seen:
                continue
            seen.add(drawn)
            answer = reversed(drawn) if self.task == "reverse" else sorted(drawn)
            problems.append(Problem(prompt=f"{self.task}: {' '.join(drawn)} =", answer=" ".join(answer)))
            if len(problems) == wanted:
                return problems
        raise EnvironmentConfigError(
            f"only {len(problems)} distinct word lists were found, {wanted} are asked for; ask for fewer problems or "
            "allow more words."
        )

    def problems(self, split: str) -> Sequence[Problem]:
        check_split(split)
        return self._drawn[:self.num_eval] if split == "eval" else self._drawn[self.num_eval:]

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion.split() == problem.answer.split() else 0.0


__all__ = ["TASKS", "WORDS", "WordListEnvironment"]
