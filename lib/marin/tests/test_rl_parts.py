"""The parts of an RL run that need no model: environments, guarded rewards, the replay buffer, the
problem schedule and the layout of a training batch."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from levanter.trainer.grpo import ADVANTAGES, SAMPLER_LOGPROBS, group_advantages
from marin.rl import ArithmeticEnvironment, Environment, EnvironmentConfigError, FormatReward, Problem, WordListEnvironment
from marin.rl.replay_buffer import ReplayBuffer, RolloutFailedError
from marin.rl.rewards import RewardHangError, RewardScorer
from marin.rl.rollout_worker import completion_seed, problems_of_batch
from marin.rl.rollouts import Completion, RolloutBatch, RolloutGroup
from marin.rl.training_batches import BatchLayout, RolloutLayoutError, training_batch

WAIT_S = 30


def test_arithmetic_problems_are_seeded_distinct_and_held_out_apart():
    env = ArithmeticEnvironment(operations="+-", max_operand=20, num_train=300, num_eval=40, seed=3)
    train, held_out = env.problems("train"), env.problems("eval")
    assert len(train) == 300 and len(held_out) == 40
    assert len({p.prompt for p in [*train, *held_out]}) == 340  # no repeats, no held-out problem trained on
    assert ArithmeticEnvironment(operations="+-", max_operand=20, num_train=300, num_eval=40, seed=3).problems("eval") == held_out
    assert ArithmeticEnvironment(operations="+-", max_operand=20, num_train=300, num_eval=40, seed=4).problems("eval") != held_out
    for problem in train[:50]:
        a, op, b = problem.prompt[:-1].partition("+") if "+" in problem.prompt else problem.prompt[:-1].partition("-")
        assert int(problem.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    problem = Problem("17+25=", "42")
    assert env.reward(problem, " 42\n") == 1.0 and env.reward(problem, "41") == 0.0 and env.reward(problem, "42 ") == 1.0
    assert env.score(problem, "42").passed and not env.score(problem, "4").passed


def test_word_lists_are_reversed_or_sorted():
    reverse = WordListEnvironment(task="reverse", num_train=50, num_eval=10)
    sort = WordListEnvironment(task="sort", num_train=50, num_eval=10)
    for problem in reverse.problems("train"):
        words = problem.prompt.removeprefix("reverse: ").removesuffix(" =").split()
        assert problem.answer.split() == words[::-1] and 2 <= len(words) <= 4
    for problem in sort.problems("eval"):
        assert problem.answer.split() == sorted(problem.prompt.removeprefix("sort: ").removesuffix(" =").split())
    problem = Problem("reverse: cat sun =", "sun cat")
    assert reverse.reward(problem, " sun  cat") == 1.0 and reverse.reward(problem, "cat sun") == 0.0


def test_a_format_reward_adds_its_weight_and_leaves_passing_to_the_task():
    env = FormatReward(ArithmeticEnvironment(num_train=10, num_eval=0), pattern=r"-?\d+", weight=0.25)
    problem = Problem("2+2=", "4")
    assert env.score(problem, "4").reward == 1.25 and env.score(problem, "4").passed
    assert env.score(problem, " 5").reward == 0.25 and not env.score(problem, "5").passed
    assert env.score(problem, "four").reward == 0.0
    assert env.problems("train") == ArithmeticEnvironment(num_train=10, num_eval=0).problems("train")


def test_environments_that_cannot_work_are_refused_with_the_numbers():
    with pytest.raises(EnvironmentConfigError, match="num_train=95 and num_eval=10 distinct problems are asked for, but these operands and operations make only 100"):
        ArithmeticEnvironment(max_operand=9, num_train=95, num_eval=10)
    with pytest.raises(EnvironmentConfigError, match="operations must be some of"):
        ArithmeticEnvironment(operations="/")
    with pytest.raises(EnvironmentConfigError, match="task must be one of reverse, sort"):
        WordListEnvironment(task="shuffle")
    with pytest.raises(EnvironmentConfigError, match="only 2 distinct word lists"):
        WordListEnvironment(words=("a", "b"), min_words=2, max_words=2, num_train=5, num_eval=0).problems("train")
    with pytest.raises(EnvironmentConfigError, match="not a regular expression"):
        FormatReward(ArithmeticEnvironment(), pattern="(")
    with pytest.raises(EnvironmentConfigError, match="split must be one of train, eval"):
        ArithmeticEnvironment().problems("test")


RELEASE = threading.Event()  # lets the hung reward calls of a test end


@dataclass(frozen=True)
class Flaky(Environment):
    """A reward that raises, hangs, returns NaN or a string for some prompts."""

    def problems(self, split):
        return [Problem(p, "1") for p in ("raise", "hang", "nan", "text", "fine")]

    def reward(self, problem, completion):
        if problem.prompt == "raise":
            raise ZeroDivisionError("division by zero")
        if problem.prompt == "hang":
            RELEASE.wait(WAIT_S)
            return 1.0
        return {"nan": float("nan"), "text": "1.0"}.get(problem.prompt, 1.0)


def test_a_reward_that_raises_hangs_or_is_not_a_number_fails_only_its_completion(caplog):
    scorer = RewardScorer(Flaky(), timeout_s=0.3)
    problems = {p.prompt: p for p in Flaky().problems("train")}
    with caplog.at_level(logging.WARNING, logger="marin.rl.rewards"):
        scores = {name: scorer.score(problem, "1", label=name) for name, problem in problems.items()}
    RELEASE.set()
    assert scores["fine"].reward == 1.0 and scores["fine"].passed and scores["fine"].failure is None
    assert scores["raise"].failure == "the reward raised ZeroDivisionError: division by zero"
    assert scores["hang"].failure == "the reward took longer than 0.3 s"
    assert scores["nan"].failure == "the reward is nan"
    assert scores["text"].failure == "the reward raised TypeError: reward() returned str '1.0', not a number"
    for name in ("raise", "hang", "nan", "text"):
        assert np.isnan(scores[name].reward) and not scores[name].passed
    failures = [r.getMessage() for r in caplog.records]
    assert len(failures) == 4 and all(m.startswith("Reward failed for") and "\n" not in m for m in failures)


def test_a_reward_that_keeps_hanging_stops_the_run():
    gate = threading.Event()

    @dataclass(frozen=True)
    class Hangs(Environment):
        def problems(self, split):
            return [Problem("p", "a")]

        def reward(self, problem, completion):
            gate.wait(WAIT_S)
            return 0.0

    scorer = RewardScorer(Hangs(), timeout_s=0.05, max_hung=3)
    try:
        for _ in range(3):
            assert scorer.score(Problem("p", "a"), "x").failure is not None
        with pytest.raises(RewardHangError, match="3 reward calls of Hangs are still running"):
            scorer.score(Problem("p", "a"), "x")
    finally:
        gate.set()


def _batch(index: int, version: int = 0, groups: int = 2, size: int = 2) -> RolloutBatch:
    completion = Completion([5, 1], [-0.5, -0.25], "x", 1.0, True, "stop")
    group = RolloutGroup(0, "p", [3, 4], [completion] * size)
    return RolloutBatch(index=index, weights_version=version, groups=[group] * groups, seconds=0.5, generated_tokens=8)


def test_the_replay_buffer_bounds_sampling_ahead_and_hands_out_each_batch_once():
    buffer = ReplayBuffer(capacity=2, end=5)
    claimed: list[int] = []

    def sampler():
        while (index := buffer.claim()) is not None:
            claimed.append(index)
            buffer.put(_batch(index))

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    buffer.open(first_to_sample=1, first_to_take=1)
    deadline = time.monotonic() + WAIT_S
    while len(claimed) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert claimed == [1, 2]  # two ahead of the batch the trainer takes next (1), and no further
    assert [buffer.take(i, timeout=WAIT_S).index for i in (1, 2, 3, 4)] == [1, 2, 3, 4]
    thread.join(WAIT_S)
    assert claimed == [1, 2, 3, 4] and not thread.is_alive() and buffer.held == 0


def test_a_failed_sampler_reaches_the_trainer_instead_of_a_wait():
    buffer = ReplayBuffer(capacity=1, end=3)
    buffer.open(0, 0)
    buffer.fail(RuntimeError("worker exploded"))
    with pytest.raises(RolloutFailedError, match="the rollout workers failed: worker exploded"):
        buffer.take(0, timeout=WAIT_S)


def test_a_training_batch_masks_each_completion_and_aligns_the_sampler_logprobs():
    ok = Completion([7, 8, 1], [-0.1, -0.2, -0.3], "ab", 1.0, True, "stop")
    wrong = Completion([9, 1], [-0.4, -0.5], "c", 0.0, False, "stop")
    failed = Completion([9, 9], [-0.6, -0.7], "cc", float("nan"), False, "length", "the reward is nan")
    batch = RolloutBatch(index=6, weights_version=5, groups=[
        RolloutGroup(0, "p", [2, 3, 4], [ok, wrong]), RolloutGroup(1, "q", [2, 5], [failed, wrong])], seconds=2.0,
        generated_tokens=9)
    out = training_batch(batch, BatchLayout(group_size=2, seq_len=7))
    np.testing.assert_array_equal(out.tokens[0], [2, 3, 4, 7, 8, 1, 0])
    np.testing.assert_array_equal(out.tokens[2], [2, 5, 9, 9, 0, 0, 0])
    # Position t predicts token t + 1: the mask covers positions 2..4 of row 0 (tokens 7, 8, 1).
    np.testing.assert_array_equal(out.loss_mask[0], [0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(out.extras[SAMPLER_LOGPROBS][0], [0, 0, -0.1, -0.2, -0.3, 0, 0])
    assert not out.loss_mask[2].any()  # the failed reward: left out of training
    advantages = group_advantages(np.asarray([1.0, 0.0, np.nan, 0.0]), 2)
    np.testing.assert_allclose(out.extras[ADVANTAGES][:, 0], advantages)
    assert advantages[2] == 0 and advantages[3] == 0  # the failed one's group has one reward left: no signal
    assert out.metrics["reward/failures"] == 1 and out.metrics["reward/mean"] == pytest.approx(1 / 3)
    assert out.metrics["reward/pass_rate"] == 0.25 and out.metrics["rollout/staleness"] == 1
    assert out.metrics["rollout/tokens_per_second"] == 4.5 and out.metrics["reward/groups_without_signal"] == 0.5
    with pytest.raises(RolloutLayoutError, match="needs 6 positions but rows hold 5"):
        training_batch(batch, BatchLayout(group_size=2, seq_len=5))


def test_every_problem_is_sampled_once_per_pass_and_batches_are_found_alone():
    seen = [p for index in range(5) for p in problems_of_batch(index, 4, 10, run_seed=1)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert problems_of_batch(3, 4, 10, run_seed=1) == seen[12:16]
    assert seen[:10] != seen[10:20]  # each pass in its own order
    assert completion_seed(0, 1, 2, 3) == completion_seed(0, 1, 2, 3) != completion_seed(0, 1, 2, 4)
