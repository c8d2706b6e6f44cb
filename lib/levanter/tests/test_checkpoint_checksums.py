"""Checkpoint files carry checksums written with the checkpoint and verified on restore: a checkpoint
whose bytes changed after it was written (one bit is enough, and Orbax reads such bytes without
complaint) is moved aside like an unreadable one and the previous one restored, saying so, on a local
disk and on object storage. The manifest must cover the folder exactly (a file it does not list, or
a name it lists without a file, fails), and a checkpoint without one is only restored when the run
allows unverified checkpoints."""

import glob
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.trainer import Checkpointer
from levanter.trainer.checkpoint_manifest import MANIFEST_NAME
from rigging import filesystem as fsx

LOGGER = "levanter.trainer.checkpoint"
STATE = {"w": jnp.arange(4096.0).reshape(64, 64), "opt": {"mu": jnp.ones((64,))}, "step": jnp.asarray(0, jnp.int32)}


def state_at(step):
    return jax.tree.map(lambda x: x + step, STATE)


def save_steps(root: str, steps=(1, 2, 3)) -> str:
    checkpointer = Checkpointer(root, asynchronous=False, keep_last=None)
    for step in steps:
        checkpointer.save(step, state_at(step))
    checkpointer.close()
    return root


def _largest_data_file(step_dir: str) -> str:
    files = glob.glob(f"{step_dir}/state/d/*") + glob.glob(f"{step_dir}/state/ocdbt.process_*/d/*")
    return max(files, key=os.path.getsize)


def _flip_bit(path: str, byte: int | None = None) -> None:
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        at = len(data) // 2 if byte is None else byte
        data[at] ^= 0x10
        f.seek(0)
        f.write(data)


def _assert_restored(state, step):
    for ours, expected in zip(jax.tree.leaves(state), jax.tree.leaves(state_at(step)), strict=True):
        np.testing.assert_array_equal(ours, expected)


def test_one_flipped_bit_in_the_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    root = save_steps(str(tmp_path / "checkpoints"))
    data_file = _largest_data_file(os.path.join(root, "3"))
    _flip_bit(data_file)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = Checkpointer(root, keep_last=None).restore_latest(STATE)
    assert step == 2
    _assert_restored(state, 2)
    aside = [name for name in os.listdir(root) if name.startswith("3.corrupt-")]
    assert len(aside) == 1
    # The warning names the checkpoint, the file and what differs, and says where it went.
    relative = os.path.relpath(data_file, os.path.join(root, "3"))
    assert f"{os.path.join(root, '3')} cannot be read" in caplog.text
    assert relative in caplog.text and "checksum" in caplog.text and aside[0] in caplog.text


def test_every_kind_of_damage_a_manifest_sees(tmp_path, caplog):
    root = save_steps(str(tmp_path / "checkpoints"), steps=(1, 2, 3, 4))
    _flip_bit(os.path.join(root, "4", "state", "_METADATA"), byte=0)  # metadata: JSON still, or not
    os.remove(_largest_data_file(os.path.join(root, "3")))  # a file gone
    with open(os.path.join(root, "2", "state", "stray"), "wb") as f:  # a file the save never wrote
        f.write(b"x")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = Checkpointer(root, keep_last=None).restore_latest(STATE)
    assert step == 1
    _assert_restored(state, 1)
    assert "missing" in caplog.text and f"state/stray is not listed in {MANIFEST_NAME}" in caplog.text


def test_the_manifest_lists_every_file_with_size_and_digest(tmp_path):
    root = save_steps(str(tmp_path / "checkpoints"), steps=(1,))
    with open(os.path.join(root, "1", MANIFEST_NAME)) as f:
        manifest = json.load(f)
    on_disk = {os.path.relpath(p, os.path.join(root, "1")) for p in glob.glob(f"{root}/1/**", recursive=True) if os.path.isfile(p)}
    # The commit marker is left out: a staged upload writes its own in its place.
    assert set(manifest["files"]) == on_disk - {MANIFEST_NAME, "commit_success.txt"}
    for name, entry in manifest["files"].items():
        assert entry["size"] == os.path.getsize(os.path.join(root, "1", name))
        assert entry["digest"].startswith(manifest["algorithm"] + ":")


def _edit_manifest(step_dir: str, edit) -> None:
    path = os.path.join(step_dir, MANIFEST_NAME)
    with open(path) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(path, "w") as f:
        json.dump(manifest, f)


def test_a_file_left_out_of_the_manifest_is_not_trusted(tmp_path, caplog):
    # A hole in the manifest: the file's entry removed, then the file damaged.
    root = save_steps(str(tmp_path / "checkpoints"))
    data_file = _largest_data_file(os.path.join(root, "3"))
    relative = os.path.relpath(data_file, os.path.join(root, "3"))
    _edit_manifest(os.path.join(root, "3"), lambda manifest: manifest["files"].pop(relative))
    _flip_bit(data_file)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = Checkpointer(root, keep_last=None).restore_latest(STATE)
    assert step == 2
    _assert_restored(state, 2)
    assert f"{relative} is not listed in {MANIFEST_NAME}" in caplog.text
    assert len([name for name in os.listdir(root) if name.startswith("3.corrupt-")]) == 1


def test_a_manifest_listing_no_files_is_not_trusted(tmp_path, caplog):
    root = save_steps(str(tmp_path / "checkpoints"), steps=(1, 2))
    _edit_manifest(os.path.join(root, "2"), lambda manifest: manifest.update(files={}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = Checkpointer(root, keep_last=None).restore_latest(STATE)
    assert step == 1
    _assert_restored(state, 1)
    # Every file is unlisted: the first few are named, and how many more there are.
    assert f"state/_METADATA is not listed in {MANIFEST_NAME}" in caplog.text and "more" in caplog.text


def test_a_listed_file_that_is_not_there_is_not_trusted(tmp_path, caplog):
    root = save_steps(str(tmp_path / "checkpoints"), steps=(1, 2))
    ghost = {"size": 1, "digest": "xxh3_128:00000000000000000000000000000000"}
    _edit_manifest(os.path.join(root, "2"), lambda manifest: manifest["files"].update({"state/ghost": ghost}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = Checkpointer(root, keep_last=None).restore_latest(STATE)
    assert step == 1
    _assert_restored(state, 1)
    assert "state/ghost is missing" in caplog.text


def test_a_checkpoint_without_a_manifest_is_set_aside_unless_allowed(tmp_path, caplog):
    root = save_steps(str(tmp_path / "checkpoints"), steps=(1, 2))
    os.remove(os.path.join(root, "2", MANIFEST_NAME))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        checkpointer = Checkpointer(root, keep_last=None)
        step, state = checkpointer.restore_latest(STATE)
    assert step == 1 and checkpointer.restored_unverified is None
    _assert_restored(state, 1)
    aside = [name for name in os.listdir(root) if name.startswith("2.corrupt-")]
    assert len(aside) == 1
    # The warning says why, where the folder went, and which setting would restore it.
    assert f"no {MANIFEST_NAME}" in caplog.text and aside[0] in caplog.text
    assert "allow_unverified_checkpoints" in caplog.text


def test_a_checkpoint_without_a_manifest_loads_when_allowed_and_says_so(tmp_path, caplog):
    root = save_steps(str(tmp_path / "checkpoints"), steps=(1, 2))
    os.remove(os.path.join(root, "2", MANIFEST_NAME))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        checkpointer = Checkpointer(root, keep_last=None, allow_unverified=True)
        step, state = checkpointer.restore_latest(STATE)
    assert step == 2 and checkpointer.restored_unverified == os.path.join(root, "2")
    _assert_restored(state, 2)
    assert f"no {MANIFEST_NAME}" in caplog.text and "unverified" in caplog.text
    assert sorted(os.listdir(root)) == ["1", "2"]


def test_a_verified_restore_is_not_reported_as_unverified(tmp_path):
    root = save_steps(str(tmp_path / "checkpoints"), steps=(1,))
    checkpointer = Checkpointer(root, keep_last=None, allow_unverified=True)
    assert checkpointer.restore_latest(STATE)[0] == 1 and checkpointer.restored_unverified is None


def test_asynchronous_saves_write_their_manifest_once_committed(tmp_path):
    root = str(tmp_path / "checkpoints")
    checkpointer = Checkpointer(root, asynchronous=True, keep_last=None)
    for step in (1, 2):
        checkpointer.save(step, state_at(step))
    checkpointer.close()
    assert all(os.path.exists(os.path.join(root, str(step), MANIFEST_NAME)) for step in (1, 2))


def test_a_flipped_bit_on_object_storage_falls_back_too(s3_prefix, caplog):
    root = fsx.join(s3_prefix, "checkpoints")
    save_steps(root)
    fs, path = fsx.filesystem(fsx.join(root, "3"))
    names = [n for n in fsx.find_files(fsx.join(root, "3")) if "/d/" in n]
    name = max(names, key=lambda n: fs.size(f"{path}/{n}"))
    data = bytearray(fs.cat_file(f"{path}/{name}"))
    data[len(data) // 2] ^= 0x10
    fs.pipe_file(f"{path}/{name}", bytes(data))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = Checkpointer(root, keep_last=None).restore_latest(STATE)
    assert step == 2
    _assert_restored(state, 2)
    assert name in caplog.text and "checksum" in caplog.text
    assert Checkpointer(root, keep_last=None).all_steps() == [1, 2]


def test_a_file_the_manifest_does_not_list_on_object_storage_is_not_trusted(s3_prefix, caplog):
    root = fsx.join(s3_prefix, "checkpoints")
    save_steps(root, steps=(1, 2))
    fs, path = fsx.filesystem(fsx.join(root, "2"))
    fs.pipe_file(f"{path}/state/stray", b"x")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step, state = Checkpointer(root, keep_last=None).restore_latest(STATE)
    assert step == 1
    _assert_restored(state, 1)
    assert f"state/stray is not listed in {MANIFEST_NAME}" in caplog.text
