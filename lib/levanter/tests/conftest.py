"""Fixtures shared by the levanter tests."""

import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest


@jax.jit
def _our_logits(model, tokens):
    return model(tokens)


@pytest.fixture(scope="session")
def assert_same_logits_as_transformers():
    """``check(our_model, hf_model)``: both give the same logits (within 1e-4) on fixed tokens.

    The tokens are 2 x 11 ids drawn from our model's vocabulary: 22 positions, enough for every
    expert of a small MoE to receive rows and for several tokens to share one.
    """
    torch = pytest.importorskip("torch")

    def check(our_model, hf_model, atol=1e-4):
        tokens = np.random.RandomState(0).randint(0, our_model.vocab_size, size=(2, 11)).astype(np.int32)
        with torch.no_grad():
            theirs = hf_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
        np.testing.assert_allclose(_our_logits(our_model, tokens), theirs, atol=atol)

    return check


# The child loads the test module by path and trains with its ``trainer_config``, ``OPTIMIZERS``,
# ``init_model`` and ``source``; at step ``kill_at`` (the checkpoint before it committed) it kills itself.
_CHILD = textwrap.dedent(
    """
    import importlib.util, os, signal, sys

    path, name, out, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    spec = importlib.util.spec_from_file_location("killed_run_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from levanter.trainer import Trainer

    def die(trainer, step, metrics):
        if step == kill_at:
            trainer.checkpointer.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    Trainer(module.trainer_config(), module.OPTIMIZERS[name], output_dir=out, hooks=[die]).train(
        module.init_model, module.source())
    """
)



@pytest.fixture(scope="session")
def train_until_killed():
    """``run(test_module_file, optimizer_name, out, kill_at)``: a training run killed with SIGKILL right
    after the checkpoint before step ``kill_at``, in a child process (no cleanup, no atexit, nothing
    flushed, as a preemption leaves it); the test then resumes the folder it leaves."""

    def run(test_module_file: str, optimizer: str, out: str, kill_at: int, timeout: float = 300) -> None:
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        child = subprocess.run([sys.executable, "-c", _CHILD, test_module_file, optimizer, out, str(kill_at)],
                               env=env, capture_output=True, text=True, timeout=timeout)
        assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]

    return run
