"""Checkpoints: a run SIGKILLed after its step-N checkpoint and resumed ends bitwise equal to an
uninterrupted run; a partial checkpoint is never loaded; a mismatched one is refused clearly."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import CheckpointError, Checkpointer, MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.tracker import read_metrics

N = 4
VOCAB, SEQ = 64, 16
MODEL = dict(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


def trainer_config():
    return TrainerConfig(
        num_train_steps=2 * N, batch_size=8, steps_per_checkpoint=N, keep_last_checkpoints=None, log_every=2,
        mesh=MeshConfig(data=1),
    )


def optimizer():
    return AdamConfig(3e-3, 0.1, warmup=2)


def source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=3)


def init_model(key):
    return LlamaConfig(**MODEL).build(VOCAB, key=key)


# The killed run: trains towards 2N, and right after step N+2 (its step-N checkpoint committed, two
# more steps done and lost) kills itself with SIGKILL: no cleanup, no atexit, like a preemption.
CHILD = textwrap.dedent(
    f"""
    import os, signal, sys
    sys.path.insert(0, {os.path.dirname(__file__)!r})
    import test_checkpoint as t
    from levanter.trainer import Trainer

    def die(trainer, step, metrics):
        if step == t.N + 2:
            trainer.checkpointer.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    Trainer(t.trainer_config(), t.optimizer(), output_dir=sys.argv[1], hooks=[die]).train(t.init_model, t.source())
    """
)


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    killed_dir = str(tmp_path_factory.mktemp("killed"))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, "-c", CHILD, killed_dir], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    steps_before_resume = Checkpointer(os.path.join(killed_dir, "checkpoints")).all_steps()
    logged_before_resume = read_metrics(os.path.join(killed_dir, "metrics.jsonl"))

    resumed = Trainer(trainer_config(), optimizer(), output_dir=killed_dir).train(init_model, source())
    straight = Trainer(trainer_config(), optimizer(), output_dir=str(tmp_path_factory.mktemp("straight"))).train(
        init_model, source()
    )
    return steps_before_resume, logged_before_resume, resumed, straight, killed_dir


def test_the_child_was_killed_after_its_step_n_checkpoint(killed_and_resumed):
    steps_before_resume, logged_before_resume, resumed, _, _ = killed_and_resumed
    assert steps_before_resume == [N]
    assert [r["step"] for r in logged_before_resume] == list(range(1, N + 3))
    assert resumed.resumed_from == N and resumed.final_step == 2 * N


def test_resumed_run_is_bitwise_equal_to_the_uninterrupted_one(killed_and_resumed):
    _, _, resumed, straight, _ = killed_and_resumed
    leaves_resumed = jax.tree.leaves(resumed.state)
    leaves_straight = jax.tree.leaves(straight.state)
    assert len(leaves_resumed) == len(leaves_straight) > 10
    for a, b in zip(leaves_resumed, leaves_straight):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed.final_train_loss == straight.final_train_loss
    # The resumed run's log replays the lost steps with the very same losses.
    rows = [r for r in read_metrics(resumed.metrics_path) if "loss" in r]
    straight_loss = {r["step"]: r["loss"] for r in read_metrics(straight.metrics_path) if "loss" in r}
    assert all(r["loss"] == straight_loss[r["step"]] for r in rows)


def test_resumed_metrics_hold_each_step_once_with_the_original_lines_up_to_the_checkpoint(killed_and_resumed):
    _, logged_before_resume, resumed, _, _ = killed_and_resumed
    records = read_metrics(resumed.metrics_path)
    # Steps N+1 and N+2 were logged by the killed run and again by the resumed one: once each now.
    assert [r["step"] for r in records] == list(range(1, 2 * N + 1))
    # Up to the checkpoint the lines are the killed run's own (wall_time differs between attempts).
    assert records[:N] == logged_before_resume[:N]
    assert records[N]["wall_time"] != logged_before_resume[N]["wall_time"]


def test_partial_checkpoint_is_never_loaded(killed_and_resumed):
    *_, killed_dir = killed_and_resumed
    root = os.path.join(killed_dir, "checkpoints")
    # What an interrupted save leaves behind: Orbax's temporary folder, with some of the arrays.
    partial = os.path.join(root, f"{3 * N}.orbax-checkpoint-tmp")
    os.makedirs(os.path.join(partial, "state"))
    with open(os.path.join(partial, "state", "garbage"), "wb") as f:
        f.write(b"\0" * 100)
    checkpointer = Checkpointer(root)
    assert checkpointer.latest_step() == 2 * N
    assert checkpointer.all_steps() == [N, 2 * N]


def test_a_checkpoint_of_another_model_is_refused(killed_and_resumed):
    *_, killed_dir = killed_and_resumed
    other = dict(MODEL, hidden_dim=48)
    trainer = Trainer(trainer_config(), optimizer(), output_dir=killed_dir)
    with pytest.raises(CheckpointError, match=r"does not match.*stored \(64, 32\) float32, expected \(64, 48\)"):
        trainer.train(lambda key: LlamaConfig(**other).build(VOCAB, key=key), source())


def test_save_policy_by_steps_and_minutes(tmp_path, monkeypatch):
    import levanter.trainer.checkpoint as checkpoint_module

    now = [1000.0]
    monkeypatch.setattr(checkpoint_module.time, "monotonic", lambda: now[0])
    by_steps = Checkpointer(str(tmp_path / "a"), every_steps=5)
    assert [s for s in range(1, 16) if by_steps.due(s)] == [5, 10, 15]
    by_time = Checkpointer(str(tmp_path / "b"), every_minutes=2)
    assert not by_time.due(1)
    now[0] += 121
    assert by_time.due(2)
    never = Checkpointer(str(tmp_path / "c"))
    assert not any(never.due(s) for s in range(1, 50))


def test_sigterm_checkpoints_then_stops(tmp_path):
    from levanter.trainer import TrainingPreempted

    def preempt(trainer, step, metrics):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    trainer = Trainer(trainer_config(), optimizer(), output_dir=str(tmp_path), hooks=[preempt])
    # Whatever handler was there before (other libraries, e.g. Ray, install their own) comes back.
    previous = signal.getsignal(signal.SIGTERM)
    # Step 3's metrics are read while step 4 runs, so the signal lands during step 4: that step
    # completes, is saved, and the run stops.
    with pytest.raises(TrainingPreempted, match="after step 4"):
        trainer.train(init_model, source())
    assert trainer.checkpointer.all_steps() == [4]
    assert signal.getsignal(signal.SIGTERM) is previous  # handler restored


def test_checkpointers_saving_at_once_in_one_process_each_commit_their_own_steps(tmp_path):
    """A sweep's steps train in threads of one process, each saving through its own Checkpointer."""
    states = {i: {"w": np.full((8,), float(i), np.float32)} for i in range(8)}
    errors: list[str] = []

    def save_three(i: int) -> None:
        try:
            checkpointer = Checkpointer(str(tmp_path / str(i)), keep_last=None)
            for step in (1, 2, 3):
                checkpointer.save(step, states[i])
            checkpointer.close()
        except Exception as e:  # reported below, with every other thread's
            errors.append(f"{i}: {e!r}")

    threads = [threading.Thread(target=save_three, args=(i,), daemon=True) for i in states]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "a save still waits after 120 s"
    assert not errors, errors
    for i, state in states.items():
        checkpointer = Checkpointer(str(tmp_path / str(i)))
        assert checkpointer.all_steps() == [1, 2, 3]
        np.testing.assert_array_equal(checkpointer.restore(3, state)["w"], state["w"])
