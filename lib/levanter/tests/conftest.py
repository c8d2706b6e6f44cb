"""Fixtures shared by the levanter tests: the comparison against transformers that the model
family tests make, and the tiny training run that the optimizer tests make."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig, OptimizerConfig
from levanter.trainer import Checkpointer, MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows

# -- against transformers ---------------------------------------------------------------------------


@jax.jit
def _our_logits(model, tokens):
    return model(tokens)


class TransformersComparison:
    """Our model and transformers' (torch, CPU, float32) on the same weights and tokens."""

    def __init__(self, torch):
        self.torch = torch

    def randomized(self, model, *, is_norm=lambda name: "norm" in name):
        """``model`` (a transformers model) in eval mode with every parameter random, from one
        seeded generator: norm scales in [0.5, 1.5), routers (``mlp.gate.weight``) with std 2 so
        routing is decisive and a mismatch shows, everything else (biases too) with std 0.15.
        Transformers starts norms and biases at constants, which would hide a misplaced tensor."""
        torch = self.torch
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if is_norm(name):
                    param.copy_(0.5 + torch.rand(param.shape, generator=generator))
                elif name.endswith("mlp.gate.weight"):
                    param.copy_(2.0 * torch.randn(param.shape, generator=generator))
                else:
                    param.copy_(0.15 * torch.randn(param.shape, generator=generator))
        return model.eval()

    def random_model(self, config_class: str, config: dict):
        """A transformers causal LM of ``config_class`` (a config class's name in transformers),
        built from ``config``, every parameter random (:meth:`randomized`)."""
        import transformers

        return self.randomized(transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config)))

    @staticmethod
    def saved_and_imported(reference, folder, **import_options):
        """``reference`` saved in ``folder`` as transformers saves it, and our import of that folder."""
        from levanter.compat.hf_checkpoints import import_from_hf

        reference.save_pretrained(folder)
        return import_from_hf(folder, **import_options)

    def their_logits(self, model, tokens) -> np.ndarray:
        with self.torch.no_grad():
            return model(self.torch.tensor(np.asarray(tokens), dtype=self.torch.long)).logits.numpy()

    @staticmethod
    def our_logits(model, tokens) -> np.ndarray:
        return np.asarray(_our_logits(model, tokens))

    def assert_same_logits(self, ours, theirs, tokens) -> None:
        """``ours`` and ``theirs`` (a transformers model) give the same logits on ``tokens``, within
        float32 rounding of a two-layer model.

        Both sides compute in float32 (unit roundoff u = 2^-24 = 6e-8). A logit is the end of about
        ten chained roundings of sums of at most 64 terms per layer, two layers: worst-case relative
        error ~ 2 * 10 * 64 * u = 8e-5 of the logits' scale; the typical (random-walk) error is
        ~100x smaller. 2e-5 of the largest logit sits between the two and far below any wiring
        mistake, which moves logits by a sizeable fraction of their scale.
        """
        expected = self.their_logits(theirs, tokens)
        tolerance = 2e-5 * float(np.max(np.abs(expected)))
        np.testing.assert_allclose(self.our_logits(ours, tokens), expected, rtol=0, atol=tolerance)


    def assert_same_greedy_decoding(self, ours, theirs, prompt, new_tokens: int = 32) -> None:
        """Greedy decoding of ``new_tokens`` ids after ``prompt`` gives the same ids from our model and
        from transformers' ``generate``, told of no end token and given an explicit attention mask
        (without one it takes the ids equal to its pad id for padding)."""
        from levanter.inference.sampling import sample

        torch = self.torch
        prompt = np.asarray(prompt, dtype=np.int32)
        with torch.no_grad():
            as_torch = torch.tensor(prompt, dtype=torch.long)
            expected = theirs.generate(as_torch, attention_mask=torch.ones_like(as_torch), max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
        np.testing.assert_array_equal(np.asarray(sample(ours, prompt, max_new_tokens=new_tokens, temperature=0.0)), expected)

    @staticmethod
    def assert_training_starts_from(folder, model_config, vocab_size: int, output_path: str):
        """A one-step training run initialised from the transformers checkpoint in ``folder`` exports
        exactly its weights: the learning rate (1e-30) is far below float32's resolution at every
        weight's magnitude, so the exported weights are the initial ones. Returns the run's result."""
        from safetensors.numpy import load_file

        from levanter.main.train_lm import InitialWeights, TrainLmConfig, train_lm

        config = TrainLmConfig(
            model=model_config,
            optimizer=AdamConfig(learning_rate=1e-30, weight_decay=0.0),
            trainer=TrainerConfig(num_train_steps=1, batch_size=8, minutes_per_checkpoint=None),
            vocab_size=vocab_size,
            output_path=output_path,
            initialize_from=InitialWeights(str(folder), "hf"),
        )
        result = train_lm(config, InMemoryWindows(np.tile(np.arange(vocab_size), 8), seq_len=16, batch_size=8))
        assert np.isfinite(result.final_train_loss)
        source, exported = load_file(os.path.join(folder, "model.safetensors")), load_file(f"{result.hf_path}/model.safetensors")
        for name, tensor in source.items():
            if name != "lm_head.weight":  # tied: transformers may store the shared table twice
                np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
        return result


@pytest.fixture(scope="session")
def hf_comparison() -> TransformersComparison:
    return TransformersComparison(pytest.importorskip("torch"))


@pytest.fixture(scope="session")
def assert_same_logits_as_transformers(hf_comparison):
    """``check(our_model, hf_model)``: both give the same logits (within 1e-4) on fixed tokens.

    The tokens are 2 x 11 ids drawn from our model's vocabulary: 22 positions, enough for every
    expert of a small MoE to receive rows and for several tokens to share one.
    """

    def check(our_model, hf_model, atol=1e-4):
        tokens = np.random.RandomState(0).randint(0, our_model.vocab_size, size=(2, 11)).astype(np.int32)
        theirs = hf_comparison.their_logits(hf_model, tokens)
        np.testing.assert_allclose(hf_comparison.our_logits(our_model, tokens), theirs, atol=atol)

    return check


# -- the optimizer tests' training run --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TinyLlamaTraining:
    """A tiny Llama trained for ``2 * n`` steps on a repeating token sequence, with a checkpoint
    every ``n`` steps: small enough for every optimizer on a CPU, long enough for the loss to fall
    and for a run killed after step ``n`` to resume."""

    use_scan: bool = False
    vocab: int = 64
    seq_len: int = 16
    batch_size: int = 8
    n: int = 4

    @property
    def model(self) -> LlamaConfig:
        return LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2,
                           max_seq_len=self.seq_len, use_scan=self.use_scan)

    def init_model(self, key):
        return self.model.build(self.vocab, key=key)

    def source(self) -> InMemoryWindows:
        return InMemoryWindows(np.tile(np.arange(self.vocab), 64), seq_len=self.seq_len, batch_size=self.batch_size, seed=3)

    def trainer_config(self, **overrides) -> TrainerConfig:
        settings = dict(num_train_steps=2 * self.n, batch_size=self.batch_size, steps_per_checkpoint=self.n,
                        keep_last_checkpoints=None, log_every=self.n, mesh=MeshConfig(data=1))
        return TrainerConfig(**{**settings, **overrides})

    def train(self, optimizer: OptimizerConfig, output_dir: str, **overrides):
        return Trainer(self.trainer_config(**overrides), optimizer, output_dir=output_dir).train(self.init_model, self.source())

    def assert_trains(self, result, label: str) -> None:
        losses = [row["loss"] for row in result.history if "loss" in row]
        assert len(losses) == 2 * self.n and all(np.isfinite(losses))
        assert losses[-1] < losses[0] - 0.1, (label, losses)

    def assert_state_round_trips(self, optimizer: OptimizerConfig, result, output_dir: str) -> None:
        """The optimizer state in the run's last checkpoint reads back bit for bit, and is not a fresh one."""
        template, _, _ = Trainer(self.trainer_config(), optimizer, output_dir=output_dir + "-template").init_state(self.init_model)
        step, restored = Checkpointer(os.path.join(output_dir, "checkpoints")).restore_latest(template)
        assert step == 2 * self.n
        saved, read = jax.tree.leaves(result.state.opt_state), jax.tree.leaves(restored.opt_state)
        assert len(saved) == len(read) >= 3
        for a, b in zip(saved, read):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # The trained state differs from a fresh one (the check above is not comparing zeros).
        assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(read, jax.tree.leaves(template.opt_state)))

    def assert_resumes_bitwise_from_its_checkpoint(self, optimizer: OptimizerConfig, result, run_dir: str, output_dir: str) -> None:
        """A run started from the step-``n`` checkpoint of the uninterrupted run in ``run_dir`` (that
        checkpoint alone, copied into a fresh run folder) ends with that run's (``result``'s) state
        bit for bit: everything the optimizer carries from step to step is in the checkpoint."""
        shutil.copytree(os.path.join(run_dir, "checkpoints", str(self.n)), os.path.join(output_dir, "checkpoints", str(self.n)))
        self._assert_resumed_to(optimizer, result, output_dir)

    def assert_resumes_bitwise_after_sigkill(self, optimizer: OptimizerConfig, result, output_dir: str, timeout: float = 300) -> None:
        """A run SIGKILLed two steps after its step-``n`` checkpoint (in a child process: no cleanup,
        no atexit, nothing flushed, as a preemption leaves it), then resumed here, ends with the
        uninterrupted run's (``result``'s) state bit for bit."""
        kill_at = self.n + 2
        child = subprocess.run(
            [sys.executable, "-c", _KILLED_RUN, __file__, json.dumps(dataclasses.asdict(self)),
             json.dumps(optimizer.to_dict()), output_dir, str(kill_at)],
            env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=timeout,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
        assert Checkpointer(os.path.join(output_dir, "checkpoints")).all_steps() == [self.n]
        self._assert_resumed_to(optimizer, result, output_dir)

    def _assert_resumed_to(self, optimizer: OptimizerConfig, result, output_dir: str) -> None:
        resumed = self.train(optimizer, output_dir)
        assert resumed.resumed_from == self.n
        for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(result.state), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# The child loads this file by path and trains the same run with the same optimizer; at step
# ``kill_at`` (once the checkpoint before it is committed) it kills itself.
_KILLED_RUN = textwrap.dedent(
    """
    import importlib.util, json, os, signal, sys

    path, run, optimizer, out, kill_at = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    spec = importlib.util.spec_from_file_location("levanter_tests_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from levanter.optim import OptimizerConfig
    from levanter.trainer import Trainer

    def die(trainer, step, metrics):
        if step == kill_at:
            trainer.checkpointer.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    run = module.TinyLlamaTraining(**run)
    Trainer(run.trainer_config(), OptimizerConfig.from_dict(optimizer), output_dir=out, hooks=[die]).train(
        run.init_model, run.source())
    """
)


@pytest.fixture(scope="session")
def tiny_llama_training() -> TinyLlamaTraining:
    """The optimizer tests' training run, on a Llama with its layers unrolled."""
    return TinyLlamaTraining()


@pytest.fixture(scope="session")
def tiny_stacked_llama_training() -> TinyLlamaTraining:
    """The optimizer tests' training run, on a Llama with its layers stacked (scanned)."""
    return TinyLlamaTraining(use_scan=True)
