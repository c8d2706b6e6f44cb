"""Starting a run from existing weights: a Hugging Face folder or another run's checkpoint, checked
against the run first, and never in place of the run's own checkpoint when it resumes."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from levanter.main.train_lm import InitialWeights, InitialWeightsError, TrainLmConfig, check_hf_weights, initializer, train_lm
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig, LionConfig
from levanter.trainer import Trainer, TrainerConfig
from levanter.trainer.checkpoint import Checkpointer
from levanter.trainer.checkpoint_reading import committed_steps
from levanter.trainer.sources import InMemoryWindows

VOCAB = 64
SEQ = 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


def _source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of two steps: its final state, its checkpoint step folder and its Hugging Face export."""
    out = str(tmp_path_factory.mktemp("run-a"))
    config = TrainLmConfig(
        model=TINY,
        optimizer=AdamConfig(learning_rate=3e-3),
        trainer=TrainerConfig(num_train_steps=2, batch_size=8, minutes_per_checkpoint=None),
        vocab_size=VOCAB,
        output_path=out,
    )
    result = train_lm(config, _source())
    (step,) = committed_steps(result.checkpoint_dir)
    trainer = Trainer(config.trainer, config.optimizer, output_dir=out)
    final, *_ = trainer.starting_state(lambda key: TINY.build(VOCAB, key=key))  # resumes the final checkpoint
    return final, f"{result.checkpoint_dir}/{step}", result.hf_path


def _start(tmp_path, initial: InitialWeights, *, model=TINY, vocab=VOCAB, optimizer=None):
    trainer = Trainer(
        TrainerConfig(num_train_steps=3, batch_size=8, seed=7), optimizer or AdamConfig(learning_rate=1e-3),
        output_dir=str(tmp_path / "run-b"),
    )
    state, _, _, resumed_from = trainer.starting_state(
        lambda key: model.build(vocab, key=key), initializer(initial, model, vocab)
    )
    assert resumed_from is None
    return state


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_hugging_face_folder_gives_the_exported_weights_and_a_fresh_optimizer(trained, tmp_path):
    final, _, hf = trained
    state = _start(tmp_path, InitialWeights(hf, "hf"))
    _assert_same(state.params, final.params)
    assert int(state.step) == 0
    counts = [leaf for leaf in jax.tree.leaves(state.opt_state) if leaf.shape == ()]
    assert counts and all(int(c) == 0 for c in counts)


def test_a_checkpoint_gives_its_weights_and_optionally_its_optimizer_state(trained, tmp_path):
    final, step_folder, _ = trained
    weights_only = _start(tmp_path, InitialWeights(step_folder, "checkpoint"))
    _assert_same(weights_only.params, final.params)
    assert int(weights_only.step) == 0 and not np.array_equal(
        np.asarray(jax.tree.leaves(weights_only.opt_state)[1]), np.asarray(jax.tree.leaves(final.opt_state)[1])
    )
    with_optimizer = _start(tmp_path, InitialWeights(step_folder, "checkpoint", load_optimizer_state=True))
    _assert_same(with_optimizer.opt_state, final.opt_state)
    assert int(with_optimizer.step) == 0  # the new run's schedule starts from its beginning


def test_a_checkpoint_on_an_object_store_is_read_through_a_local_copy(trained, tmp_path):
    final, _, _ = trained
    stored = Checkpointer("memory://initial-weights/checkpoints", asynchronous=False)
    stored.save(2, final)
    stored.close()
    assert committed_steps("memory://initial-weights/checkpoints") == [2]
    state = _start(tmp_path, InitialWeights("memory://initial-weights/checkpoints/2", "checkpoint"))
    _assert_same(state.params, final.params)


def test_the_runs_own_checkpoint_comes_before_the_initial_weights(tmp_path):
    calls = []
    trainer = Trainer(TrainerConfig(num_train_steps=3, batch_size=8), AdamConfig(learning_rate=1e-3), output_dir=str(tmp_path))
    state, *_ = trainer.starting_state(lambda key: TINY.build(VOCAB, key=key))
    trainer.checkpointer.save(1, state)
    trainer.checkpointer.wait()

    def initialize(fresh):
        calls.append(fresh)
        return fresh

    again = Trainer(TrainerConfig(num_train_steps=3, batch_size=8), AdamConfig(learning_rate=1e-3), output_dir=str(tmp_path))
    _, _, _, resumed_from = again.starting_state(lambda key: TINY.build(VOCAB, key=key), initialize)
    assert resumed_from == 1 and calls == []


def test_a_model_of_other_shapes_is_refused_naming_the_field(trained):
    _, _, hf = trained
    with pytest.raises(InitialWeightsError, match="intermediate_dim=128 where the weights have intermediate_dim=64"):
        check_hf_weights(hf, dataclasses.replace(TINY, intermediate_dim=128), VOCAB)
    # How the model runs may differ from how it was trained.
    check_hf_weights(hf, dataclasses.replace(TINY, use_scan=True, remat="full"), VOCAB)


def test_another_vocabulary_is_refused_with_both_sizes(trained, tmp_path):
    _, step_folder, hf = trained
    with pytest.raises(InitialWeightsError, match="vocabulary of 64 tokens, but the training data's tokenizer has 100"):
        check_hf_weights(hf, TINY, 100)
    with pytest.raises(InitialWeightsError, match="vocabulary of 64 tokens, but the training data's tokenizer has 100"):
        _start(tmp_path, InitialWeights(step_folder, "checkpoint"), vocab=100)


def test_optimizer_state_needs_a_checkpoint_of_the_same_optimizer(trained, tmp_path):
    _, step_folder, hf = trained
    with pytest.raises(InitialWeightsError, match="holds no optimizer state"):
        InitialWeights(hf, "hf", load_optimizer_state=True)
    with pytest.raises(InitialWeightsError, match="same model and optimizer"):
        _start(tmp_path, InitialWeights(step_folder, "checkpoint", load_optimizer_state=True),
               optimizer=LionConfig(learning_rate=1e-4))
