"""Arithmetic problems generated offline, rewarded by exact match: ``"23+58="`` wants ``"81"``.

The problems are drawn once from a seed, without repeats, and split: the first ``num_eval`` are held
out, the next ``num_train`` are trained on, so no held-out problem is ever trained on. The same
settings give the same problems on every machine.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from marin.rl.environments import Environment, EnvironmentConfigError, Problem, check_split

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass(frozen=True)
class ArithmeticEnvironment(Environment):
    """``a OP b =`` for operands from ``min_operand`` to ``max_operand`` and OP among ``operations``;
    a completion earns 1 when, stripped of surrounding whitespace, it is the result in decimal."""

    operations: str = "+"
    min_operand: int = 0
    max_operand: int = 99
    num_train: int = 2000
    num_eval: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.operations) - set(OPERATIONS))
        if not self.operations or unknown:
            raise EnvironmentConfigError(f"operations must be some of {''.join(OPERATIONS)}, got {self.operations!r}.")
        if not 0 <= self.min_operand <= self.max_operand:
            raise EnvironmentConfigError(f"need 0 <= min_operand <= max_operand, got {self.min_operand} and {self.max_operand}.")
        space = len(self.operations) * (self.max_operand - self.min_operand + 1) ** 2
        if self.num_train < 1 or self.num_eval < 0 or self.num_train + self.num_eval > space:
            raise EnvironmentConfigError(
                f"num_train={self.num_train} and num_eval={self.num_eval} distinct problems are asked for, but these "
                f"operands and operations make only {space:,}; ask for fewer or widen max_operand."
            )

    @cached_property
    def _drawn(self) -> list[Problem]:
        width = self.max_operand - self.min_operand + 1
        rng = np.random.default_rng(self.seed)
        codes = rng.choice(len(self.operations) * width * width, size=self.num_eval + self.num_train, replace=False)
        problems = []
        for code in codes.tolist():
            op, rest = divmod(code, width * width)
            a, b = divmod(rest, width)
            a, b, symbol = a + self.min_operand, b + self.min_operand, self.operations[op]
            problems.append(Problem(prompt=f"{a}{symbol}{b}=", answer=str(OPERATIONS[symbol](a, b))))
        return problems

    def problems(self, split: str) -> Sequence[Problem]:
        check_split(split)
        return self._drawn[:self.num_eval] if split == "eval" else self._drawn[self.num_eval:]

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion.strip() == problem.answer else 0.0


__all__ = ["ArithmeticEnvironment", "OPERATIONS"]
