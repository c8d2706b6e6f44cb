"""Killing an RL run, or one of its rollout workers, loses no rollout already trained on and trains
none twice: the resumed run ends with the very weights, and the very batches, of a run never killed.

The runs are on-policy (``max_staleness=0``): every batch is sampled by the weights that train on
it, whoever samples it, so an uninterrupted run is the reference to the bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest

from fray.cluster import ship_by_value
from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from levanter.trainer.checkpoint_reading import committed_steps
from levanter.trainer.tracker import read_metrics
from marin.execution.artifact import load_artifact
from marin.execution.ownership.resumable_state import resumable_entries
from marin.execution.ownership.step_ownership import latest_work_path
from marin.execution.step_runner import StepRunner
from marin.rl import ArithmeticEnvironment, RlTrainedModel, RolloutSampling, grpo, rl_train

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=32)
STEPS = 6


@dataclass(frozen=True)
class DigitShare(ArithmeticEnvironment):
    """Rewards the share of a completion's characters that are digits: a dense reward, so a random
    model's completions differ and every step moves the weights. With ``kill_marker``, the first
    reward call (in a rollout worker's process) kills that process."""

    kill_marker: str = ""

    def reward(self, problem, completion):
        if self.kill_marker and not os.path.exists(self.kill_marker):
            Path(self.kill_marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def declare(hf: str, environment: DigitShare = DigitShare(max_operand=9, num_train=60, num_eval=0), backend: str = "threads"):
    return rl_train(
        "rl/digits", model=hf, environment=environment, num_train_steps=STEPS, prompts_per_step=2, rollouts_per_prompt=4,
        sampling=RolloutSampling(max_tokens=4), loss=grpo(kl_coef=0.05), optimizer=AdamConfig(learning_rate=1e-2, weight_decay=0.0),
        sync_every=1, max_staleness=0, steps_per_checkpoint=2, rollout_backend=backend,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The starting model, and the run that was never killed."""
    root = tmp_path_factory.mktemp("rl-resume")
    texts = [p.prompt + p.answer for p in DigitShare(max_operand=9, num_train=60, num_eval=0).problems("train")] * 5
    save_tokenizer(train_bpe_tokenizer(texts, 280), root / "tokenizer", bos_token="<|endoftext|>")
    vocab = load_tokenizer(str(root / "tokenizer")).vocab_size
    export_to_hf(TINY.build(vocab, key=jax.random.PRNGKey(1)), str(root / "hf"), tokenizer_dir_or_obj=str(root / "tokenizer"))
    runner = StepRunner(prefix=str(root / "uninterrupted"))
    runner.run([declare(str(root / "hf"))])
    return {"root": root, "hf": str(root / "hf"), "out": Path(runner.output_path_for(declare(str(root / "hf"))))}


def _batches(out: Path) -> list[dict]:
    return [json.loads((out / "rollouts" / f"batch-{i:06d}.json").read_text()) for i in range(STEPS)]


def _tokens(batch: dict) -> list[list[int]]:
    return [c["tokens"] for group in batch["groups"] for c in group["completions"]]


def _assert_same_run(out: Path, reference: dict) -> RlTrainedModel:
    result = load_artifact(str(out), RlTrainedModel).result
    assert result.final_step == STEPS
    steps = [line["step"] for line in read_metrics(str(out / "metrics.jsonl")) if "loss" in line]
    assert steps == list(range(1, STEPS + 1))  # every step once: none lost, none logged twice
    ours, theirs = _batches(out), _batches(reference["out"])
    assert [b["index"] for b in ours] == list(range(STEPS)) and sorted(os.listdir(out / "rollouts")) == [
        f"batch-{i:06d}.json" for i in range(STEPS)]
    for mine, expected in zip(ours, theirs):
        assert _tokens(mine) == _tokens(expected) and mine["weights_version"] == expected["weights_version"] == mine["index"]
    trained, expected = import_from_hf(result.hf_path), import_from_hf(str(reference["out"] / "hf"))
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    start = import_from_hf(reference["hf"])
    assert not np.array_equal(np.asarray(trained.embed.weight), np.asarray(start.embed.weight))
    return result


_KILLED_RUN = textwrap.dedent(
    """
    import importlib.util, os, signal, sys
    from marin.execution.step_runner import StepRunner
    from marin.rl.rollout_log import RolloutLog

    path, hf, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = importlib.util.spec_from_file_location("rl_resume_module", path)
    module = sys.modules["rl_resume_module"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    write = RolloutLog.write

    def write_then_die(self, batch):
        if batch.index == 3:  # steps 1-3 trained, 3 batches logged: die before logging the fourth
            os.kill(os.getpid(), signal.SIGKILL)
        write(self, batch)

    RolloutLog.write = write_then_die
    StepRunner(prefix=prefix).run([module.declare(hf)])
    """
)


@pytest.mark.slow
def test_killing_the_step_resumes_without_losing_or_repeating_trained_rollouts(reference, tmp_path):
    prefix = tmp_path / "prefix"
    child = subprocess.run([sys.executable, "-c", _KILLED_RUN, __file__, reference["hf"], str(prefix)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    runner = StepRunner(prefix=str(prefix))
    out = runner.output_path_for(declare(reference["hf"]))
    killed = Path(latest_work_path(out))
    # 0 or 2: saving is asynchronous. A rerun takes over a checkpoint once its checksum manifest is
    # written, after Orbax renames the step into place: a kill between the two leaves a folder
    # committed_steps lists and the rerun does not take over (it trains from step 0).
    carried = resumable_entries(str(killed))
    checkpoint = max((int(entry.split("/")[1]) for entry in carried if entry.startswith("checkpoints/")), default=0)
    assert checkpoint in committed_steps(str(killed / "checkpoints")) + [0]
    logged = {name: (killed / "rollouts" / name).read_bytes() for name in os.listdir(killed / "rollouts")}
    assert sorted(logged) == [f"batch-{i:06d}.json" for i in range(3)]
    runner.run([declare(reference["hf"])])
    result = _assert_same_run(Path(out), reference)
    # The resumed attempt trained the steps after the checkpoint on the batches the killed one had
    # logged for them, read back, and sampled from batch 3 on.
    assert result.batches_reused == 3 - checkpoint and result.worker_restarts == 0
    for name, content in logged.items():
        assert (Path(out) / "rollouts" / name).read_bytes() == content


@pytest.mark.slow
def test_a_killed_rollout_worker_is_replaced_and_its_batch_sampled_again(reference, tmp_path):
    ship_by_value(sys.modules[__name__])  # the environment travels to the worker processes with its code
    marker = tmp_path / "killed"
    environment = DigitShare(max_operand=9, num_train=60, num_eval=0, kill_marker=str(marker))
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    step = declare(reference["hf"], environment, backend="processes")
    runner.run([step])
    assert int(marker.read_text()) != os.getpid()  # a worker process died, not the trainer's
    result = _assert_same_run(Path(runner.output_path_for(step)), reference)
    assert result.worker_restarts == 1
