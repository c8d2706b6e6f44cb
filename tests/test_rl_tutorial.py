"""The RL tutorial (experiments/tutorials/rl_tiny_model.py): its data and graph, and that GRPO raises the
held-out pass rate of the SFT model it starts from.

The learning test runs the tutorial as a reader does (``marin run``, one CPU device) with a shorter
GRPO run (40 steps instead of 100), on-policy and seeded, so it gives the same figures every time on
a machine; docs/post-training.md gives those of the full tutorial.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from levanter.tokenization import load_tokenizer
from marin.execution.lazy import lower
from marin.execution.step_runner import StepRunner

from experiments.tutorials import rl_tiny_model as tutorial

ROOT = Path(__file__).resolve().parents[1]


def test_the_tutorial_trains_sft_on_worked_training_problems_and_rl_on_top(tmp_path):
    steps = {step.name: step for step in lower(tutorial.rl_model)}
    assert set(steps) == {"datasets/arithmetic-worked", "tokenizers/arithmetic-characters", "tokenized/arithmetic-worked",
                          "checkpoints/arithmetic-sft", "checkpoints/arithmetic-rl"}
    assert tutorial.sft_model in tutorial.rl_model.deps
    runner = StepRunner(prefix=str(tmp_path))
    runner.run([tutorial.worked_problems, tutorial.character_tokenizer])
    documents = [json.loads(line)["text"] for line in open(f"{runner.output_path_for(tutorial.worked_problems)}/train.jsonl")]
    held_out = {p.prompt for p in tutorial.ARITHMETIC.problems("eval")}
    assert len(documents) == len(tutorial.ARITHMETIC.problems("train")) and documents[0].count("=") == 1
    assert not any(doc.split("=")[0] + "=" in held_out for doc in documents)  # nothing held out is trained on
    tokenizer = load_tokenizer(runner.output_path_for(tutorial.character_tokenizer))
    assert tokenizer.tokenizer.encode("23+58=81").tokens == list("23+58=81")  # one token per character
    assert tokenizer.bos_id == tokenizer.eos_id is not None


@pytest.mark.slow
@pytest.mark.timeout(1500)  # about 2.5 min alone on 2 cores; a loaded machine (the suite's own workers) triples it
def test_grpo_raises_the_held_out_pass_rate_of_the_sft_model(tmp_path):
    # As a reader runs it: one CPU device and XLA's default optimisations (the suite's simulated
    # devices and fast-compile flags change the float sums, and so the figures, and run slower).
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    env.update(MARIN_PREFIX=str(tmp_path / "prefix"), JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # The held-out problems are measured at the start and after the last step only (eval_every=40).
    done = subprocess.run(
        [sys.executable, "-m", "marin.cli", "run", "experiments/tutorials/rl_tiny_model.py", "--set", "rl.num_train_steps=40",
         "--set", "rl.eval_every=40"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sft = float(re.search(r"SFT model: ([0-9.]+)", done.stdout).group(1))
    rl, steps, start = re.search(r"RL model: +([0-9.]+) after (\d+) GRPO steps \(([0-9.]+) at the start", done.stdout).groups()
    # The RL run measured its starting weights (the SFT model's) the same way, greedily: the same figure.
    assert int(steps) == 40 and float(start) == sft
    # Seeded and on-policy, the run gives the same figures every time on a machine, but any change to
    # the float sums of training (a kernel, a reduction order) moves the SFT model it starts from, and
    # so both figures. The margin is what 200 held-out problems can tell apart: a pass rate near 0.3
    # has a binomial standard error of sqrt(0.3 * 0.7 / 200) = 0.032, the difference of two such
    # rates 0.046, and a rise of 0.1 (20 more problems answered right) is over two of those.
    assert float(rl) >= sft + 0.1, done.stdout
