"""An rl_train step end to end on a tiny model: rollouts from the engine, GRPO through the trainer,
metrics every step, the rollout log, the export, and rewards that fail without stopping the run."""

from __future__ import annotations

import itertools
import json
import math
import threading
from dataclasses import dataclass

import jax
import numpy as np
import pytest

from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from levanter.trainer.tracker import read_metrics
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.rl import ArithmeticEnvironment, Environment, RlConfigError, RlTrainedModel, RolloutSampling, grpo, rl_train
from marin.rl.rollouts import RolloutBatch

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=32)
_HANGS = itertools.count()
_RELEASE = threading.Event()


@dataclass(frozen=True)
class FlakyArithmetic(ArithmeticEnvironment):
    """Arithmetic whose reward raises for answers that are multiples of 5, returns NaN for answers
    one past them, and hangs (twice in the run, on training problems) for answers two past them."""

    def reward(self, problem, completion):
        kind = int(problem.answer) % 5
        if kind == 0:
            raise ValueError("the checker is broken")
        if kind == 1:
            return float("nan")
        if kind == 2 and problem not in self.problems("eval") and next(_HANGS) < 2:
            _RELEASE.wait(30)
        return super().reward(problem, completion)


ENV = FlakyArithmetic(max_operand=9, num_train=60, num_eval=8)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """A random tiny Llama in Hugging Face format, with a tokenizer of arithmetic text beside it."""
    root = tmp_path_factory.mktemp("rl-step")
    texts = [p.prompt + p.answer for p in ENV.problems("train")] * 5
    save_tokenizer(train_bpe_tokenizer(texts, 280), root / "tokenizer", bos_token="<|endoftext|>")
    vocab = load_tokenizer(str(root / "tokenizer")).vocab_size
    export_to_hf(TINY.build(vocab, key=jax.random.PRNGKey(0)), str(root / "hf"), tokenizer_dir_or_obj=str(root / "tokenizer"))
    return root


def test_an_rl_step_trains_logs_every_step_and_fails_only_the_completions_whose_reward_fails(policy):
    step = rl_train(
        "rl/flaky-arithmetic", model=str(policy / "hf"), environment=ENV, num_train_steps=3, prompts_per_step=4,
        rollouts_per_prompt=4, sampling=RolloutSampling(temperature=1.0, max_tokens=4), loss=grpo(kl_coef=0.05),
        optimizer=AdamConfig(learning_rate=1e-2, weight_decay=0.0), max_staleness=1, reward_timeout_s=0.5,
        log_every=1, rollout_workers=2,  # two samplers in this process, finishing batches in any order
    )
    runner = StepRunner(prefix=str(policy / "prefix"))
    try:
        report = runner.run([step])
    finally:
        _RELEASE.set()
    assert report.ran == ["rl/flaky-arithmetic"]
    out = runner.output_path_for(step)
    lines = read_metrics(f"{out}/metrics.jsonl")
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2, 3]
    # The starting weights are measured before step 1, the trained ones after the last.
    assert [line["step"] for line in lines if "heldout/pass_rate" in line] == [0, 3] and lines[0]["step"] == 0
    for line in steps:
        for key in ("policy/kl", "policy/entropy", "reward/mean", "reward/pass_rate", "reward/failures",
                    "rollout/response_length", "rollout/tokens_per_second", "tokens_per_second", "loss_tokens"):
            assert math.isfinite(line[key]), (key, line)
        assert 0 <= line["rollout/staleness"] <= 1 and 1 <= line["rollout/response_length"] <= 4
    assert steps[0]["policy/kl"] == pytest.approx(0.0, abs=1e-6)  # step 1 trains the reference itself

    batches = [RolloutBatch.from_json(json.loads(open(f"{out}/rollouts/batch-{i:06d}.json").read())) for i in range(3)]
    failures = [c.failure for b in batches for c in b.completions if c.failure is not None]
    assert sum(line["reward/failures"] for line in steps) == len(failures)
    assert "the reward raised ValueError: the checker is broken" in failures
    assert "the reward is nan" in failures and "the reward took longer than 0.5 s" in failures
    for index, batch in enumerate(batches):
        assert batch.index == index and index - 1 <= batch.weights_version <= index
        for completion in batch.completions:
            assert len(completion.logprobs) == len(completion.tokens) and all(lp <= 0 for lp in completion.logprobs)
        assert steps[index]["loss_tokens"] == sum(len(c.tokens) for c in batch.completions if c.trainable)

    result = load_artifact(out, RlTrainedModel).result
    assert result.final_step == 3 and result.completions_trained == 48
    assert result.heldout_pass_rate_start == lines[0]["heldout/pass_rate"]
    assert "held-out pass rate" in result.summary() and "grpo (epsilon=0.2" in result.summary()
    trained = import_from_hf(result.hf_path)
    start = import_from_hf(str(policy / "hf"))
    assert not np.allclose(np.asarray(trained.embed.weight), np.asarray(start.embed.weight))
    assert runner.run([step]).cached == ["rl/flaky-arithmetic"]


_GATE = threading.Event()


@dataclass(frozen=True)
class HangingArithmetic(ArithmeticEnvironment):
    def reward(self, problem, completion):
        _GATE.wait(30)
        return 0.0


def test_a_reward_that_keeps_hanging_stops_the_run_with_the_reason(policy):
    step = rl_train("rl/hanging", model=str(policy / "hf"), environment=HangingArithmetic(max_operand=9, num_train=60, num_eval=0),
                    num_train_steps=2, prompts_per_step=4, rollouts_per_prompt=4, sampling=RolloutSampling(max_tokens=2),
                    reward_timeout_s=0.05)
    try:
        report = StepRunner(prefix=str(policy / "prefix")).run([step], raise_on_failure=False)
    finally:
        _GATE.set()
    outcome = report.outcome_of("rl/hanging")
    assert outcome.outcome.name == "FAILED"
    assert "reward calls of HangingArithmetic are still running past their 0.05 s timeout" in outcome.error


def test_rl_settings_that_cannot_work_are_refused_when_declared(policy):
    common = dict(model=str(policy / "hf"), environment=ENV, num_train_steps=2)
    with pytest.raises(RlConfigError, match="max_staleness must be at least sync_every - 1 = 3"):
        rl_train("rl/x", sync_every=4, max_staleness=2, **common)
    with pytest.raises(RlConfigError, match=r"rollouts_per_prompt must be an integer >= 2 \(advantages compare"):
        rl_train("rl/x", rollouts_per_prompt=1, **common)

    class Plain(Environment):  # an Environment that is not a frozen dataclass
        def problems(self, split):
            return []

        def reward(self, problem, completion):
            return 0.0

    with pytest.raises(RlConfigError, match="Plain must be a @dataclass\\(frozen=True\\)"):
        rl_train("rl/x", model=str(policy / "hf"), environment=Plain(), num_train_steps=2)
    with pytest.raises(RlConfigError, match="environment must be an Environment"):
        rl_train("rl/x", model=str(policy / "hf"), environment="arithmetic", num_train_steps=2)
