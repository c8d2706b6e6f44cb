"""Training with its output on an object store (``memory://``, and ``s3://`` on the S3 test server).

Checkpoints, ``metrics.jsonl``, tracker files, the Hugging Face export and tokenizers land in the
bucket; an interrupted run resumes from there to the very parameters of an uninterrupted one; and no
URL is ever turned into a local folder (each test runs in an empty working directory, which must
stay empty: ``os.path.abspath("s3://b/x")`` would have made ``./s3:/b/x`` there).
"""

import errno
import json
import logging
import os
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.path import async_path

from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from levanter.trainer import CheckpointError, Checkpointer, MeshConfig, Trainer, TrainerConfig
from levanter.trainer.checkpoint_errors import CheckpointDiskFullError
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.tracker import JsonlTracker, build_trackers, read_metrics
from rigging import filesystem as fsx

N = 3  # checkpoint every N steps; runs are 2N steps
VOCAB, SEQ = 64, 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


@pytest.fixture(params=["memory", "s3"])
def store(request, tmp_path, monkeypatch):
    """An empty folder URL on the object store; the test runs in an empty local working directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    if request.param == "memory":
        url = f"memory://object-store-test-{uuid.uuid4().hex[:12]}"
    else:
        url = request.getfixturevalue("s3_prefix")
    yield url
    assert os.listdir(cwd) == [], f"a URL was written as a local path: {os.listdir(cwd)}"


def trainer_config(**overrides):
    return TrainerConfig(**{
        "num_train_steps": 2 * N, "batch_size": 8, "steps_per_checkpoint": N, "keep_last_checkpoints": None,
        "log_every": 2, "mesh": MeshConfig(data=1), **overrides,
    })


def optimizer():
    return AdamConfig(3e-3, 0.1, warmup=2)


def source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=3)


def init_model(key):
    return TINY.build(VOCAB, key=key)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """The same run, uninterrupted, in a local folder: the trajectory a resumed run must follow."""
    return Trainer(trainer_config(), optimizer(), output_dir=str(tmp_path_factory.mktemp("straight"))).train(
        init_model, source()
    )


class Interrupted(Exception):
    """Stands in for a crash in the middle of training."""


def test_an_interrupted_run_resumes_from_its_checkpoint_in_the_bucket_to_the_same_parameters(store, straight_run):
    metrics_url = fsx.join(store, "metrics.jsonl")
    logged_at_interrupt = []

    def crash(trainer, step, metrics):
        if step == N + 2:
            trainer.checkpointer.wait()
            logged_at_interrupt.extend(r["step"] for r in read_metrics(metrics_url))
            raise Interrupted

    with pytest.raises(Interrupted):
        Trainer(trainer_config(), optimizer(), output_dir=store, hooks=[crash]).train(init_model, source())
    # The object holds every step up to the checkpoint as soon as the checkpoint exists.
    assert set(range(1, N + 1)) <= set(logged_at_interrupt)
    assert Checkpointer(fsx.join(store, "checkpoints")).all_steps() == [N]
    before_resume = read_metrics(metrics_url)
    assert [r["step"] for r in before_resume] == list(range(1, N + 3))  # the rest is written when the run ends

    resumed = Trainer(trainer_config(), optimizer(), output_dir=store).train(init_model, source())
    assert resumed.resumed_from == N and resumed.final_step == 2 * N
    assert resumed.checkpoint_dir == fsx.join(store, "checkpoints") and resumed.checkpoint_steps == [N, 2 * N]
    assert resumed.metrics_path == metrics_url
    for ours, theirs in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(straight_run.state), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))

    # Cut back to the checkpoint on resume: each step once, the original lines up to the checkpoint.
    records = read_metrics(metrics_url)
    assert [r["step"] for r in records] == list(range(1, 2 * N + 1))
    assert records[:N] == before_resume[:N]
    straight_loss = {r["step"]: r["loss"] for r in read_metrics(straight_run.metrics_path)}
    assert all(r["loss"] == straight_loss[r["step"]] for r in records)
    stored = fsx.find_files(fsx.join(store, "checkpoints"))
    assert any(name.startswith(f"{2 * N}/state/") for name in stored)


# -- the checkpointer on its own ------------------------------------------------------------------

STATE = {"w": jnp.arange(64.0).reshape(8, 8), "opt": {"mu": jnp.ones((8,))}, "step": jnp.asarray(0, jnp.int32)}


def state_at(step):
    return jax.tree.map(lambda x: x + step, STATE)


def assert_state_equal(state, expected):
    for ours, theirs in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_checkpoints_in_the_bucket_are_listed_only_when_whole_and_pruned_to_keep_last(store):
    root = fsx.join(store, "checkpoints")
    # What a killed upload leaves behind: a step folder whose commit never happened.
    fsx.atomic_write(fsx.join(root, "7", "state", "_METADATA"), b"half an upload")
    checkpointer = Checkpointer(root, keep_last=2)  # asynchronous saves
    assert checkpointer.all_steps() == [] and checkpointer.latest_step() is None
    for step in (1, 2, 3):
        checkpointer.save(step, state_at(step))
    checkpointer.wait()
    assert checkpointer.all_steps() == [2, 3]
    # Step 1 is pruned, the half upload cleared away; no local path names the URL.
    assert {name.split("/")[0] for name in fsx.find_files(root)} == {"2", "3"}
    assert checkpointer.path_of(3) == fsx.join(root, "3")
    step, state = Checkpointer(root).restore_latest(STATE)
    assert step == 3
    assert_state_equal(state, state_at(3))
    checkpointer.close()


def test_an_unreadable_checkpoint_in_the_bucket_is_set_aside_and_the_one_before_restored(store, caplog):
    root = fsx.join(store, "checkpoints")
    checkpointer = Checkpointer(root, asynchronous=False, keep_last=None)
    for step in (1, 2):
        checkpointer.save(step, state_at(step))
    checkpointer.close()
    fsx.atomic_write(fsx.join(root, "2", "state", "_METADATA"), b"\x00not json{{")
    with caplog.at_level(logging.WARNING, logger="levanter.trainer.checkpoint"):
        step, state = Checkpointer(root).restore_latest(STATE)
    assert step == 1
    assert_state_equal(state, state_at(1))
    assert f"{fsx.join(root, '2')} cannot be read" in caplog.text
    folders = {name.split("/")[0] for name in fsx.find_files(root)}
    assert "1" in folders and "2" not in folders and any(f.startswith("2.corrupt-") for f in folders)
    assert Checkpointer(root).all_steps() == [1]


def test_a_failed_upload_is_reported_and_the_step_never_listed(store, monkeypatch):
    root = fsx.join(store, "checkpoints")
    checkpointer = Checkpointer(root, keep_last=None)
    checkpointer.save(1, state_at(1))
    checkpointer.wait()

    write = fsx.atomic_write

    def marker_unreachable(url, data):
        if url.endswith("/2/commit_success.txt"):
            raise ConnectionError("connection reset by peer")
        write(url, data)

    with monkeypatch.context() as patch:
        patch.setattr(fsx, "atomic_write", marker_unreachable)
        checkpointer.save(2, state_at(2))
        with pytest.raises(CheckpointError, match=r"step 2 could not be uploaded to .*/checkpoints/2 \(ConnectionError"):
            checkpointer.wait()
    assert any(name.startswith("2/") for name in fsx.find_files(root))  # its files went up, its marker did not
    assert checkpointer.all_steps() == [1]
    assert Checkpointer(root).restore_latest(STATE)[0] == 1


def test_a_full_staging_disk_says_disk_full_and_names_the_bucket(store, monkeypatch):
    root = fsx.join(store, "checkpoints")
    checkpointer = Checkpointer(root, keep_last=None)
    checkpointer.save(1, state_at(1))
    checkpointer.wait()

    async def no_space(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(async_path, "write_text", no_space)
    with pytest.raises(CheckpointDiskFullError) as caught:
        checkpointer.save(2, state_at(2))
        checkpointer.wait()
    message = str(caught.value)
    assert message.startswith("Disk full:") and root in message and "staging" in message
    assert "newest complete checkpoint is step 1" in message
    assert checkpointer.all_steps() == [1]


# -- trackers ---------------------------------------------------------------------------------------


def test_metrics_on_a_url_are_rewritten_whole_and_cut_back_on_resume(store):
    url = fsx.join(store, "metrics.jsonl")
    trackers = build_trackers(["jsonl"], metrics_path=url, log_dir=store)
    for step in range(1, 6):
        trackers.log(step, {"loss": 1.0 / step})
    assert not fsx.exists(url)  # an object store cannot append: lines wait for the next rewrite
    trackers.flush()  # what the trainer does before each checkpoint
    assert [r["step"] for r in read_metrics(url)] == [1, 2, 3, 4, 5]
    trackers.log(6, {"loss": 0.1})
    trackers.close()
    assert [r["step"] for r in read_metrics(url)] == [1, 2, 3, 4, 5, 6]

    resumed = build_trackers(["jsonl"], metrics_path=url, log_dir=store, resume_step=3)
    assert [r["step"] for r in read_metrics(url)] == [1, 2, 3]
    resumed.log(4, {"loss": 0.2})
    resumed.close()
    assert read_metrics(url) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}, {"step": 3, "loss": 1.0 / 3},
                                 {"step": 4, "loss": 0.2}]


def test_metrics_on_a_url_are_rewritten_every_so_many_seconds(store):
    url = fsx.join(store, "metrics.jsonl")
    tracker = JsonlTracker(url, rewrite_every_seconds=0)
    tracker.log(1, {"loss": 1.5})
    assert read_metrics(url) == [{"step": 1, "loss": 1.5}]  # neither flushed nor closed
    tracker.close()


class FakeSummaryWriter:
    """Writes one line per scalar into a file of its log folder, as TensorBoard's writer would."""

    def __init__(self, log_dir):
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, "events.out.tfevents.fake")

    def add_scalar(self, name, value, step):
        with open(self.path, "a") as f:
            f.write(f"{step} {name} {value}\n")

    def flush(self):
        pass

    def close(self):
        pass


def test_tensorboard_files_of_a_run_on_a_url_are_written_locally_and_copied_to_the_bucket(store, monkeypatch, caplog):
    import levanter.trainer.tracker.tensorboard as tensorboard

    monkeypatch.setattr(tensorboard, "_summary_writer_class", lambda: FakeSummaryWriter)
    with caplog.at_level(logging.INFO, logger="levanter.trainer.tracker"):
        trackers = build_trackers(["jsonl", "tensorboard"], metrics_path=fsx.join(store, "metrics.jsonl"), log_dir=store)
    assert "locally" in caplog.text and fsx.join(store, "tensorboard") in caplog.text
    trackers.log(1, {"loss": 2.5})
    trackers.close()
    assert fsx.read_text(fsx.join(store, "tensorboard", "events.out.tfevents.fake")) == "1 loss 2.5\n"


# -- Hugging Face export/import and tokenizers -----------------------------------------------------


@pytest.mark.parametrize("sharded", [False, True])
def test_hf_export_to_the_bucket_imports_back_with_the_same_logits(store, synthetic_stories, sharded):
    model = TINY.build(VOCAB, key=jax.random.PRNGKey(4))
    tokenizer_folder = save_tokenizer(train_bpe_tokenizer(synthetic_stories[:50], 300), fsx.join(store, "tokenizer"))
    hf = fsx.join(store, "hf")
    out = export_to_hf(model, hf, tokenizer_dir_or_obj=tokenizer_folder, max_shard_bytes=20_000 if sharded else 2**30)
    assert out == hf
    files = set(fsx.find_files(hf))
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= files
    assert ("model.safetensors.index.json" in files) == sharded and ("model.safetensors" in files) != sharded
    assert json.loads(fsx.read_text(fsx.join(hf, "config.json")))["model_type"] == "llama"

    again = import_from_hf(hf)
    tokens = np.random.RandomState(0).randint(0, VOCAB, size=(2, 11)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(model(tokens)), np.asarray(again(tokens)))
    assert load_tokenizer(hf).identity == load_tokenizer(tokenizer_folder).identity


def test_a_tokenizer_saved_to_the_bucket_loads_back_as_the_same_tokenizer(store, synthetic_stories, tmp_path):
    tok = train_bpe_tokenizer(synthetic_stories[:50], 300)
    folder = save_tokenizer(tok, fsx.join(store, "tokenizer"))
    assert folder == fsx.join(store, "tokenizer")
    assert set(fsx.find_files(folder)) == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    local = load_tokenizer(save_tokenizer(tok, str(tmp_path / "tokenizer")))
    loaded = load_tokenizer(folder)
    assert loaded.identity == local.identity and loaded.eos_token == local.eos_token == "<|endoftext|>"
    assert loaded.tokenizer.encode("Once upon a time").ids == tok.encode("Once upon a time").ids


# -- the entry point ----------------------------------------------------------------------------------


def test_train_lm_writes_its_whole_output_folder_into_the_bucket(store, synthetic_stories):
    from levanter.main.train_lm import TrainLmConfig, train_lm

    tokenizer_folder = save_tokenizer(train_bpe_tokenizer(synthetic_stories[:50], 300), fsx.join(store, "tokenizer"))
    config = TrainLmConfig(
        model=TINY, optimizer=optimizer(), trainer=trainer_config(num_train_steps=N, steps_per_checkpoint=None),
        vocab_size=VOCAB, output_path=fsx.join(store, "run"), tokenizer=tokenizer_folder,
    )
    result = train_lm(config, source(), {"validation": lambda: source().sequential_batches(limit=1)})
    run = fsx.join(store, "run")
    assert result.output_path == run and result.hf_path == fsx.join(run, "hf")
    assert result.checkpoint_paths == [fsx.join(run, "checkpoints", str(N))]
    assert json.loads(fsx.read_text(result.eval_path))["step"] == N
    assert [r["step"] for r in read_metrics(result.metrics_path) if "loss" in r] == list(range(1, N + 1))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(fsx.find_files(result.hf_path))
    assert import_from_hf(result.hf_path).vocab_size == VOCAB
