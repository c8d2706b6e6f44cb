"""Damaged checkpoints and full disks: an unreadable newest checkpoint (or one whose files no longer
match their checksums, or that has no checksums unless the run allows it) is moved aside with a WARNING
and the one before it resumed (or training starts afresh, saying so); a checkpoint of another model
is still refused and never moved; a full disk during a save is reported as such."""

import asyncio
import errno
import glob
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from orbax.checkpoint._src.path import async_path, temporary_paths

from levanter.main.train_lm import TrainLmConfig, train_lm
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import CheckpointError, Checkpointer, MeshConfig, Trainer, TrainerConfig
from levanter.trainer.checkpoint_errors import CheckpointDiskFullError
from levanter.trainer.checkpoint_manifest import MANIFEST_NAME
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.tracker import CompositeTracker, read_metrics

LOGGER = "levanter.trainer.checkpoint"
STATE = {"w": jnp.arange(64.0).reshape(8, 8), "opt": {"mu": jnp.ones((8,))}, "step": jnp.asarray(0, jnp.int32)}


def state_at(step):
    return jax.tree.map(lambda x: x + step, STATE)


def saved_checkpoints(root, steps=(1, 2, 3)) -> str:
    checkpointer = Checkpointer(str(root), asynchronous=False, keep_last=None)
    for step in steps:
        checkpointer.save(step, state_at(step))
    checkpointer.close()
    return str(root)


def _truncate(path):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _scribble(path):
    with open(path, "wb") as f:
        f.write(b"\x00not json{{")


def _empty(step_dir):
    shutil.rmtree(step_dir)
    os.makedirs(step_dir)


# What a bad disk, an interrupted copy or a storage bug leaves in a committed checkpoint folder.
def _data_files(step_dir):
    # TensorStore's OCDBT data: small arrays end up in the top database, larger ones in the process's.
    return glob.glob(f"{step_dir}/state/d/*") + glob.glob(f"{step_dir}/state/ocdbt.process_*/d/*")


def _flip_one_bit(step_dir):
    # Orbax reads a flipped bit as other numbers without an error; only the checksum manifest sees it.
    path = max(_data_files(step_dir), key=os.path.getsize)
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0x01
        f.seek(0)
        f.write(data)


DAMAGE = {
    "one bit flipped in array data": _flip_one_bit,
    "truncated array data": lambda d: [_truncate(p) for p in _data_files(d)],
    "array data deleted": lambda d: [os.remove(p) for p in _data_files(d)],
    "garbage _METADATA": lambda d: _scribble(f"{d}/state/_METADATA"),
    "garbage _sharding": lambda d: _scribble(f"{d}/state/_sharding"),
    "garbage array_metadatas": lambda d: _scribble(f"{d}/state/array_metadatas/process_0"),
    "manifest missing": lambda d: os.remove(f"{d}/state/manifest.ocdbt"),
    "empty folder": _empty,
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_an_unreadable_newest_checkpoint_is_set_aside_and_the_previous_one_restored(tmp_path, caplog, damage):
    root = saved_checkpoints(tmp_path / "checkpoints")
    DAMAGE[damage](os.path.join(root, "3"))
    checkpointer = Checkpointer(root, asynchronous=False, keep_last=None)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = checkpointer.restore_latest(STATE)
    assert step == 2
    for ours, expected in zip(jax.tree.leaves(state), jax.tree.leaves(state_at(2)), strict=True):
        np.testing.assert_array_equal(ours, expected)
    # The folder is named in the warning and kept, under a name no later run picks up.
    aside = [name for name in os.listdir(root) if name.startswith("3.corrupt-")]
    assert len(aside) == 1 and not os.path.exists(os.path.join(root, "3"))
    assert f"{os.path.join(root, '3')} cannot be read" in caplog.text and aside[0] in caplog.text
    assert checkpointer.all_steps() == [1, 2]
    assert Checkpointer(root).all_steps() == [1, 2]
    # Step 3 can be written again, and is then what a new run resumes from.
    checkpointer.save(3, state_at(3))
    checkpointer.close()
    assert Checkpointer(root).restore_latest(STATE)[0] == 3


def test_a_checkpointer_built_on_the_folder_does_not_delete_a_save_started_after_it(tmp_path, monkeypatch):
    # Orbax clears the temporary folders of saves cut short in a thread of its own. Here that clean-up
    # starts only once a save is writing its temporary folder: the moment it deleted that folder under
    # load, when the checkpointer that started it had already been built and returned.
    root = tmp_path / "checkpoints"
    clean_up = temporary_paths.cleanup_temporary_paths

    async def once_a_save_is_writing(directory, **kwargs):
        for _ in range(100):  # 2 s at most: after it, the clean-up runs as Orbax's would
            if glob.glob(os.path.join(str(directory), "*.orbax-checkpoint-tmp*")):
                break
            await asyncio.sleep(0.02)
        await clean_up(directory, **kwargs)

    writer = Checkpointer(str(root), asynchronous=False, keep_last=None)
    writer.save(1, state_at(1))
    monkeypatch.setattr(temporary_paths, "cleanup_temporary_paths", once_a_save_is_writing)
    assert Checkpointer(str(root)).all_steps() == [1]
    writer.save(2, state_at(2))
    writer.close()
    monkeypatch.undo()
    step, state = Checkpointer(str(root)).restore_latest(STATE)
    assert step == 2 and np.array_equal(state["w"], state_at(2)["w"])


def test_when_no_checkpoint_can_be_read_training_starts_afresh_and_says_so(tmp_path, caplog):
    root = saved_checkpoints(tmp_path / "checkpoints", steps=(1, 2))
    DAMAGE["garbage _METADATA"](os.path.join(root, "2"))
    DAMAGE["truncated array data"](os.path.join(root, "1"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert Checkpointer(root).restore_latest(STATE) is None
    assert "No checkpoint in" in caplog.text and "starts from scratch" in caplog.text
    assert sorted(name.split(".")[0] for name in os.listdir(root)) == ["1", "2"]
    assert all(".corrupt-" in name for name in os.listdir(root))


def test_no_checkpoint_at_all_is_a_quiet_fresh_start(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert Checkpointer(str(tmp_path / "checkpoints")).restore_latest(STATE) is None
    assert caplog.text == ""


def test_a_checkpoint_of_another_model_is_refused_and_left_in_place(tmp_path):
    root = saved_checkpoints(tmp_path / "checkpoints")
    other = dict(STATE, w=jnp.zeros((8, 4)))
    with pytest.raises(CheckpointError, match=r"does not match.*stored \(8, 8\) float32, expected \(8, 4\)"):
        Checkpointer(root).restore_latest(other)
    assert sorted(os.listdir(root)) == ["1", "2", "3"]


def test_a_storage_outage_is_not_mistaken_for_corruption(tmp_path, monkeypatch):
    root = saved_checkpoints(tmp_path / "checkpoints")

    def unavailable(self, step, args=None):
        raise ValueError('UNAVAILABLE: Error reading "w/0": connection reset by peer')

    monkeypatch.setattr(ocp.CheckpointManager, "restore", unavailable)
    with pytest.raises(CheckpointError, match=r"could not be read.*UNAVAILABLE.*left in place"):
        Checkpointer(root).restore_latest(STATE)
    assert sorted(os.listdir(root)) == ["1", "2", "3"]


def test_several_processes_do_not_fall_back_on_their_own(tmp_path, monkeypatch):
    root = saved_checkpoints(tmp_path / "checkpoints")
    DAMAGE["garbage _METADATA"](os.path.join(root, "3"))
    checkpointer = Checkpointer(root)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(CheckpointError, match=r"3 cannot be read.*2 processes.*move it aside"):
        checkpointer.restore_latest(STATE)
    assert sorted(os.listdir(root)) == ["1", "2", "3"]


# -- a full disk ------------------------------------------------------------------------------------


def _disk_full_from(error):
    async def write_text(path, text):
        raise error

    return write_text


# How a full disk surfaces: Python writes of Orbax's metadata raise OSError(ENOSPC); TensorStore's
# array writes raise a ValueError whose text carries the OS error code.
DISK_FULL = {
    "OSError": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "TensorStore": ValueError(
        'RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database: Failed to write 2240 bytes to file 7: '
        "No space left on device [os_error_code='28']"
    ),
}


@pytest.mark.parametrize("source", DISK_FULL)
@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_full_disk_during_a_save_says_disk_full(tmp_path, monkeypatch, source, asynchronous):
    root = str(tmp_path / "checkpoints")
    checkpointer = Checkpointer(root, asynchronous=asynchronous, keep_last=None)
    checkpointer.save(1, state_at(1))
    checkpointer.wait()
    monkeypatch.setattr(async_path, "write_text", _disk_full_from(DISK_FULL[source]))
    with pytest.raises(CheckpointDiskFullError) as caught:
        checkpointer.save(2, state_at(2))
        checkpointer.wait()  # an asynchronous save reports its failure here
    message = str(caught.value)
    assert message.startswith(f"Disk full: a checkpoint could not be written to {root}")
    assert "free of" in message and "newest complete checkpoint is step 1" in message
    assert "Free space" in message


# -- through the trainer ----------------------------------------------------------------------------

VOCAB, SEQ, N = 64, 16, 2
MODEL = dict(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


def _trainer_config(**settings):
    return TrainerConfig(
        num_train_steps=2 * N, batch_size=8, steps_per_checkpoint=N, keep_last_checkpoints=None, log_every=2,
        mesh=MeshConfig(data=1), **settings,
    )


def _source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=3)


def _train(output_dir, **settings):
    trainer = Trainer(_trainer_config(**settings), AdamConfig(3e-3, 0.1, warmup=1), output_dir=str(output_dir))
    return trainer.train(lambda key: LlamaConfig(**MODEL).build(VOCAB, key=key), _source())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run of 2N steps with checkpoints at N and 2N, kept untouched as the source of copies."""
    output = tmp_path_factory.mktemp("finished")
    result = _train(output)
    assert result.checkpoint_steps == [N, 2 * N]
    return output


def test_the_trainer_resumes_from_the_newest_readable_checkpoint(finished_run, tmp_path, caplog):
    output = shutil.copytree(finished_run, tmp_path / "run")
    DAMAGE["truncated array data"](os.path.join(output, "checkpoints", str(2 * N)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = _train(output)
    assert result.resumed_from == N and result.final_step == 2 * N
    assert result.checkpoint_steps == [N, 2 * N]
    assert any(name.startswith(f"{2 * N}.corrupt-") for name in os.listdir(os.path.join(output, "checkpoints")))
    assert f"{os.path.join(output, 'checkpoints', str(2 * N))} cannot be read" in caplog.text
    assert [r["step"] for r in read_metrics(result.metrics_path)] == list(range(1, 2 * N + 1))


def test_the_trainer_resumes_past_a_flipped_bit_on_the_uninterrupted_trajectory(finished_run, tmp_path, caplog):
    output = shutil.copytree(finished_run, tmp_path / "run")
    DAMAGE["one bit flipped in array data"](os.path.join(output, "checkpoints", str(2 * N)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = _train(output)
    assert result.resumed_from == N and "checksum" in caplog.text
    # Steps N+1..2N are trained again from the good checkpoint: the same losses, bit for bit.
    losses = {r["step"]: r["loss"] for r in read_metrics(result.metrics_path) if "loss" in r}
    original = {r["step"]: r["loss"] for r in read_metrics(os.path.join(finished_run, "metrics.jsonl")) if "loss" in r}
    assert losses and losses == original


def test_the_trainer_starts_afresh_when_no_checkpoint_can_be_read(finished_run, tmp_path, caplog):
    output = shutil.copytree(finished_run, tmp_path / "run")
    for step in (N, 2 * N):
        DAMAGE["garbage _METADATA"](os.path.join(output, "checkpoints", str(step)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = _train(output)
    assert result.resumed_from is None and result.final_step == 2 * N
    assert "starts from scratch" in caplog.text
    assert [r["step"] for r in read_metrics(result.metrics_path)] == list(range(1, 2 * N + 1))


def test_the_trainer_does_not_resume_from_a_checkpoint_without_a_manifest(finished_run, tmp_path, caplog):
    output = shutil.copytree(finished_run, tmp_path / "run")
    os.remove(os.path.join(output, "checkpoints", str(2 * N), MANIFEST_NAME))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = _train(output)
    assert result.resumed_from == N and result.final_step == 2 * N and result.unverified_checkpoint is None
    assert any(name.startswith(f"{2 * N}.corrupt-") for name in os.listdir(os.path.join(output, "checkpoints")))
    assert f"no {MANIFEST_NAME}" in caplog.text and "allow_unverified_checkpoints" in caplog.text


def test_an_allowed_unverified_resume_is_logged_and_recorded_in_the_summary(finished_run, tmp_path, caplog, monkeypatch):
    output = shutil.copytree(finished_run, tmp_path / "run")
    step_dir = os.path.join(output, "checkpoints", str(2 * N))
    os.remove(os.path.join(step_dir, MANIFEST_NAME))
    summaries = []
    monkeypatch.setattr(CompositeTracker, "log_summary", lambda self, metrics: summaries.append(dict(metrics)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = _train(output, allow_unverified_checkpoints=True)
    assert result.resumed_from == 2 * N and result.unverified_checkpoint == step_dir
    assert f"no {MANIFEST_NAME}" in caplog.text and "unverified" in caplog.text
    assert summaries[-1]["unverified_checkpoint"] == step_dir


def test_train_lm_records_an_unverified_resume_in_eval_json(finished_run, tmp_path):
    output = shutil.copytree(finished_run, tmp_path / "run")
    step_dir = os.path.join(output, "checkpoints", str(2 * N))
    os.remove(os.path.join(step_dir, MANIFEST_NAME))
    config = TrainLmConfig(
        model=LlamaConfig(**MODEL), optimizer=AdamConfig(3e-3, 0.1, warmup=1),
        trainer=_trainer_config(allow_unverified_checkpoints=True), vocab_size=VOCAB, output_path=str(output),
        export_hf=False,
    )
    result = train_lm(config, _source())
    with open(result.eval_path) as f:
        assert json.load(f)["unverified_checkpoint"] == step_dir


def test_the_trainer_reports_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(async_path, "write_text", _disk_full_from(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    with pytest.raises(CheckpointDiskFullError, match="Disk full: a checkpoint could not be written to"):
        _train(tmp_path / "run")
