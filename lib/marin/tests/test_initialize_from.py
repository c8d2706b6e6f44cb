"""``train_lm(..., initialize_from=...)``: training that starts from existing weights (another training
step, a Hugging Face folder or model id, a checkpoint folder), their place in the step's identity,
and the refusals of weights that cannot start the run."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig, LionConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.datasets.hub import HubRevision, HubUnreachableError
from marin.execution.artifact import load_artifact
from marin.execution.records.executor_files import STATUS_FAILED, write_status
from marin.execution.records.run_report import StepRunFailed
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.initial_weights import InitializeFromError, resolve_initial_weights
from marin.experiment.train import TrainConfigError, TrainedModel, train_lm
from rigging import filesystem as fsx

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=128)
# Far below float32's resolution at any weight's magnitude: a step at this rate leaves every weight
# as it was, so the run's exported weights are the weights it started from.
FROZEN = AdamConfig(learning_rate=1e-30)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("inputs")
    texts = synthetic_stories[:150]
    (root / "train.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(texts, 512), str(root / "tokenizer"))
    save_tokenizer(train_bpe_tokenizer(texts, 600), str(root / "tokenizer-600"))
    return root


def _data(inputs: Path, tokenizer: str = "tokenizer"):
    return tokenized(f"tokenized/stories-{tokenizer}", str(inputs / "train.jsonl"), str(inputs / tokenizer))


def _train(inputs: Path, name: str, steps: int, *, tokenizer: str = "tokenizer", **kwargs):
    args = {"model": TINY, "optimizer": AdamConfig(learning_rate=3e-3), "minutes_per_checkpoint": None}
    args.update(kwargs)
    return train_lm(
        name=name, datasets={_data(inputs, tokenizer): 1.0}, batch_size=8, seq_len=128, num_train_steps=steps,
        num_samples=0, **args,
    )


def _result(prefix: str, handle) -> TrainedModel:
    return load_artifact(StepRunner(prefix=prefix).output_path_for(handle), TrainedModel).result


def _losses(result: TrainedModel) -> list[float]:
    return [r["loss"] for r in map(json.loads, Path(result.metrics_path).read_text().splitlines()) if "loss" in r]


def _assert_same_weights(folder_a: str, folder_b: str) -> None:
    a, b = load_file(f"{folder_a}/model.safetensors"), load_file(f"{folder_b}/model.safetensors")
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.fixture(scope="module")
def run_a(inputs, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("prefix"))
    a = _train(inputs, "checkpoints/a", steps=3)
    StepRunner(prefix=prefix).run([a])
    return prefix, a, _result(prefix, a)


@pytest.fixture(scope="module")
def exported(run_a, tmp_path_factory) -> Path:
    """A Hugging Face folder holding A's final weights, written by export_to_hf."""
    _, _, trained = run_a
    folder = tmp_path_factory.mktemp("exported") / "a-hf"
    export_to_hf(import_from_hf(trained.hf_path), str(folder))
    return folder


# -- continuing another training step -------------------------------------------------------------


def test_continuing_a_run_starts_from_its_final_weights_and_reruns_nothing_upstream(inputs, run_a):
    prefix, a, trained = run_a
    b = _train(inputs, "checkpoints/b", steps=1, model=None, optimizer=FROZEN, initialize_from=a)
    assert a in b.deps and b.hash_attrs["model"] == TINY  # the config comes from the upstream step
    report = StepRunner(prefix=prefix).run([b])
    assert report.ran == ["checkpoints/b"]
    assert set(report.cached) == {"tokenized/stories-tokenizer", "checkpoints/a"}
    continued = _result(prefix, b)
    _assert_same_weights(continued.hf_path, trained.hf_path)
    # B's first step saw the batch A's first step saw, with A's trained weights instead of random ones.
    assert _losses(continued)[0] < _losses(trained)[0] - 0.1
    assert continued.initialized_from.startswith("the final checkpoint of training step checkpoints/a")
    assert "started from: the final checkpoint of training step checkpoints/a" in continued.summary()


def test_an_interrupted_run_resumes_from_its_own_checkpoint_not_the_initial_weights(inputs, run_a, caplog):
    prefix, a, _ = run_a
    d = _train(inputs, "checkpoints/d", steps=2, initialize_from=a, steps_per_checkpoint=1)
    StepRunner(prefix=prefix).run([d])
    out = Path(StepRunner(prefix=prefix).output_path_for(d))
    uninterrupted = _losses(_result(prefix, d))
    # As a preemption after step 1 leaves it: the step FAILED, its checkpoint of step 1 kept.
    shutil.rmtree(out / "checkpoints" / "2")
    write_status(str(out), STATUS_FAILED, identity=d.identity, error="preempted")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="levanter"):
        report = StepRunner(prefix=prefix).run([d])
    logged = caplog.text
    assert report.ran == ["checkpoints/d"]
    assert "Resumed from checkpoint step 1" in logged and "Starting from the weights" not in logged
    assert _losses(_result(prefix, d)) == uninterrupted


# -- a Hugging Face folder ---------------------------------------------------------------------------


def test_a_hugging_face_folder_gives_its_weights_and_its_model_config(inputs, run_a, exported):
    prefix, _, _ = run_a
    c = _train(inputs, "checkpoints/c", steps=1, model=None, optimizer=FROZEN, initialize_from=str(exported))
    assert c.hash_attrs["model"] == TINY  # read from config.json
    assert c.identity == _train(inputs, "checkpoints/c", steps=1, optimizer=FROZEN, initialize_from=str(exported)).identity
    report = StepRunner(prefix=prefix).run([c])
    assert report.ran == ["checkpoints/c"]
    _assert_same_weights(_result(prefix, c).hf_path, str(exported))


def test_a_hub_id_resolves_through_the_offline_aware_resolver(exported):
    class CachedOnly:
        def latest_revision(self, repo_id, repo_type):
            raise HubUnreachableError("no network in tests")

        def cached_revision(self, repo_id, repo_type):
            return HubRevision(repo_id, repo_type, "0123abcd" * 5, "cache", str(exported))

    resolved = resolve_initial_weights("someone/tiny-llama", hub=CachedOnly())
    assert resolved.identity == {"kind": "hub", "repo_id": "someone/tiny-llama", "revision": "0123abcd" * 5}
    assert resolved.model == TINY
    assert resolved.locate(ctx=None).path == str(exported)


# -- identity ------------------------------------------------------------------------------------------


def test_the_initial_weights_are_part_of_the_identity(inputs, run_a, exported, tmp_path):
    _, a, trained = run_a
    other_step = _train(inputs, "checkpoints/a", steps=4)
    from_a = _train(inputs, "checkpoints/e", steps=1, initialize_from=a)
    assert from_a.identity == _train(inputs, "checkpoints/e", steps=1, initialize_from=a).identity
    assert from_a.identity != _train(inputs, "checkpoints/e", steps=1, initialize_from=other_step).identity
    assert from_a.identity != _train(inputs, "checkpoints/e", steps=1).identity

    # A folder is identified by its content, not its place.
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    from_folder = _train(inputs, "checkpoints/e", steps=1, initialize_from=str(exported))
    assert from_folder.identity == _train(inputs, "checkpoints/e", steps=1, initialize_from=str(copy)).identity
    export_to_hf(TINY.build(512, key=jax.random.PRNGKey(1)), str(copy))
    assert from_folder.identity != _train(inputs, "checkpoints/e", steps=1, initialize_from=str(copy)).identity

    # A checkpoint: the run's folder, its checkpoints/ and its newest step are the same weights.
    run_folder = Path(trained.output_path)
    by_run = _train(inputs, "checkpoints/e", steps=1, initialize_from=str(run_folder))
    assert by_run.hash_attrs["initialize_from"]["step"] == 3
    for spelling in (run_folder / "checkpoints", run_folder / "checkpoints" / "3"):
        assert _train(inputs, "checkpoints/e", steps=1, initialize_from=str(spelling)).identity == by_run.identity
    resumed = _train(inputs, "checkpoints/e", steps=1, initialize_from=str(run_folder), resume_optimizer=True)
    assert resumed.identity != by_run.identity
    # The same checkpoint in an object store.
    fs, _ = fsx.filesystem("memory://")
    fs.put(str(run_folder / "checkpoints" / "3"), "/initialize-from/checkpoints/3", recursive=True)
    remote = _train(inputs, "checkpoints/e", steps=1, initialize_from="memory://initialize-from/checkpoints")
    assert remote.identity == by_run.identity


def test_without_initial_weights_the_hash_is_what_it_always_was(inputs, monkeypatch, tmp_path):
    assert "initialize_from" not in _train(inputs, "checkpoints/a", steps=3).hash_attrs
    # The tutorial's training step, offline on a machine with an empty Hugging Face cache, as the docs show it.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    from experiments.tutorials.train_tiny_model import nano_tinystories_model

    assert nano_tinystories_model.short_hash == "72472b56"


# -- starting with the optimizer state -------------------------------------------------------------------


def test_a_checkpoint_folder_can_start_a_run_with_its_optimizer_state(inputs, run_a, caplog):
    prefix, _, trained = run_a
    e = _train(inputs, "checkpoints/e", steps=1, initialize_from=trained.output_path, resume_optimizer=True)
    with caplog.at_level(logging.INFO, logger="levanter"):
        StepRunner(prefix=prefix).run([e])
    assert "Starting from the weights and optimizer state of checkpoint" in caplog.text
    assert _losses(_result(prefix, e))[0] < _losses(trained)[0] - 0.1


# -- refusals -------------------------------------------------------------------------------------


def test_a_vocabulary_mismatch_is_refused_naming_both_sizes(inputs, run_a, exported):
    prefix, _, _ = run_a
    mismatched = _train(inputs, "checkpoints/v", steps=1, tokenizer="tokenizer-600", initialize_from=str(exported))
    with pytest.raises(StepRunFailed) as caught:
        StepRunner(prefix=prefix).run([mismatched])
    message = str(caught.value)
    assert "vocabulary of 512 tokens" in message and "tokenizer has 600" in message


def test_resume_optimizer_from_a_hugging_face_folder_is_refused(inputs, exported):
    with pytest.raises(InitializeFromError, match="Hugging Face model, which holds no optimizer state"):
        _train(inputs, "checkpoints/x", steps=1, initialize_from=str(exported), resume_optimizer=True)
    with pytest.raises(TrainConfigError, match="needs initialize_from"):
        _train(inputs, "checkpoints/x", steps=1, resume_optimizer=True)


def test_weights_that_cannot_start_the_declared_run_are_refused_when_declared(inputs, run_a, exported, tmp_path):
    _, a, trained = run_a
    with pytest.raises(InitializeFromError, match="hidden_dim=64 where the weights have hidden_dim=32"):
        _train(inputs, "checkpoints/x", steps=1, model=LlamaConfig(hidden_dim=64, intermediate_dim=64, num_layers=2,
               num_heads=2, num_kv_heads=2, max_seq_len=128), initialize_from=str(exported))
    with pytest.raises(InitializeFromError, match="trained with 'adam', but this run's optimizer is 'lion'"):
        _train(inputs, "checkpoints/x", steps=1, optimizer=LionConfig(learning_rate=1e-4), initialize_from=a,
               resume_optimizer=True)
    with pytest.raises(InitializeFromError, match="neither a Hugging Face folder"):
        _train(inputs, "checkpoints/x", steps=1, initialize_from=str(tmp_path))
    with pytest.raises(TrainConfigError, match="needs model= here"):
        _train(inputs, "checkpoints/x", steps=1, model=None, initialize_from=f"{trained.output_path}/checkpoints")
