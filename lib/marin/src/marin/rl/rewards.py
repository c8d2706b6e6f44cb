"""Scoring completions with an environment's reward, so that a broken reward fails only its own completion.

A reward function is the user's code, run on what a model wrote. :class:`RewardScorer` runs each call
in a thread of its own and waits at most ``timeout_s``: a reward that raises, runs past the timeout,
or returns something that is not a finite number gives that completion a :class:`Score` with a
``failure`` (one log line says which problem and why), and the run goes on; the training batch leaves
the completion out. A thread cannot be stopped from outside, so a hung call keeps its thread;
after ``max_hung`` of them are still running, scoring stops the run with :class:`RewardHangError`,
because a reward that hangs that often is broken, not unlucky.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

from marin.errors import MarinError
from marin.rl.environments import Environment, Problem, Score

logger = logging.getLogger(__name__)


class RewardHangError(MarinError, RuntimeError):
    """Too many reward calls are still running past their timeout: the reward function hangs."""


@dataclass
class _Call:
    done: threading.Event
    score: Score | None = None
    error: BaseException | None = None


class RewardScorer:
    """Scores completions of one environment's problems; see the module docstring."""

    def __init__(self, environment: Environment, *, timeout_s: float = 10.0, max_hung: int = 8):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.environment = environment
        self.timeout_s = timeout_s
        self.max_hung = max_hung
        self._hung: list[threading.Thread] = []

    def score(self, problem: Problem, completion: str, *, label: str = "") -> Score:
        """The completion's score; a failed reward gives ``Score(nan, False, failure)``."""
        self._hung = [thread for thread in self._hung if thread.is_alive()]
        if len(self._hung) >= self.max_hung:
            raise RewardHangError(
                f"{len(self._hung)} reward calls of {type(self.environment).__name__} are still running past their "
                f"{self.timeout_s:g} s timeout; the reward function hangs. Fix it (or raise the timeout) and run again."
            )
        call = _Call(threading.Event())
        thread = threading.Thread(target=self._run, args=(call, problem, completion), daemon=True, name="reward")
        thread.start()
        if not call.done.wait(self.timeout_s):
            self._hung.append(thread)
            return self._failed(problem, label, f"the reward took longer than {self.timeout_s:g} s")
        if call.error is not None:
            return self._failed(problem, label, f"the reward raised {type(call.error).__name__}: {call.error}")
        score = call.score
        if not isinstance(score, Score) or isinstance(score.reward, bool) or not isinstance(score.reward, (int, float)):
            return self._failed(problem, label, f"the reward is not a number: {getattr(score, 'reward', score)!r}")
        if not math.isfinite(score.reward):
            return self._failed(problem, label, f"the reward is {score.reward}")
        return Score(float(score.reward), bool(score.passed))

    def _run(self, call: _Call, problem: Problem, completion: str) -> None:
        try:
            call.score = self.environment.score(problem, completion)
        except BaseException as error:  # noqa: BLE001 - any failure of the user's reward fails this completion only
            call.error = error
        finally:
            call.done.set()

    def _failed(self, problem: Problem, label: str, why: str) -> Score:
        logger.warning("Reward failed for %s (prompt %r): %s; the completion is left out of training.",
                       label or "a completion", problem.prompt[:80], why)
        return Score(float("nan"), False, why)


__all__ = ["RewardHangError", "RewardScorer"]
