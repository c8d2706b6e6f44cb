"""TensorBoard and W&B trackers in real runs, read back with their own formats' readers and compared
with ``metrics.jsonl``; a W&B that cannot start leaves the run alone; which trackers a run uses."""

import glob
import json
import logging
import os
import struct
import sys
import time

import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.tracker import TrackerUnavailableError, build_trackers, read_metrics, resolve_tracker_names

VOCAB = 64
SEQ = 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
STEPS = 5
COMPARED = ("loss", "lr", "grad_norm")


def train_briefly(output_dir, trackers):
    config = TrainerConfig(
        num_train_steps=STEPS, batch_size=8, log_every=1, mesh=MeshConfig(data=1), trackers=trackers,
        checkpoint_at_end=False, wandb_run_name="roundtrip",
    )
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=0)
    result = Trainer(config, AdamConfig(3e-3, 0.1, warmup=2), output_dir=str(output_dir)).train(
        lambda key: TINY.build(VOCAB, key=key), source
    )
    return {r["step"]: r for r in read_metrics(result.metrics_path) if "loss" in r}


@pytest.fixture
def quiet_wandb(tmp_path, monkeypatch):
    """W&B with no credentials and no state outside ``tmp_path``."""
    home = tmp_path / "home"
    home.mkdir()
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / "no-netrc"))
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return monkeypatch


# -- TensorBoard ---------------------------------------------------------------------------------


def test_tensorboard_event_files_hold_each_steps_metrics_as_jsonl_does(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    jsonl = train_briefly(tmp_path / "run", ("jsonl", "tensorboard"))
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert set(COMPARED) <= set(events.Tags()["scalars"])
    for name in COMPARED:
        scalars = events.Scalars(name)
        assert [s.step for s in scalars] == list(range(1, STEPS + 1))
        # Event files store scalars as float32.
        assert [s.value for s in scalars] == [float(np.float32(jsonl[s.step][name])) for s in scalars]


# -- W&B -----------------------------------------------------------------------------------------


def read_wandb_records(path):
    """The protobuf records of a W&B run file (``run-<id>.wandb``).

    The file is a 7-byte header (``:W&B``, a 2-byte magic number, a version byte), then 32 KiB blocks
    of chunks, each a 7-byte header (checksum, little-endian 2-byte length, type) and its bytes; a
    record is one FULL chunk or FIRST, MIDDLE..., LAST; a block's tail shorter than a chunk header is
    padding. Each record is a ``wandb_internal_pb2.Record``.
    """
    from wandb.proto import wandb_internal_pb2

    block, full, first, middle, last = 32 * 1024, 1, 2, 3, 4
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pending, pos = [], [], 7
    while pos + 7 <= len(data):
        left_in_block = block - pos % block
        if left_in_block < 7:
            pos += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:  # zero padding at the end of a block
            continue
        assert kind in (full, first, middle, last), f"{path}: unknown chunk type {kind}"
        pending.append(chunk)
        if kind in (full, last):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(pending))
            records.append(record)
            pending = []
    return records


def closed_run_records(path, timeout=30.0):
    """The records of a finished run's file. W&B's service process writes the file and may still be at
    it for a moment after ``finish()`` returns; the file is whole once it holds the exit record."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def wandb_history(path):
    """{step: {key: value}} of the history records of a finished W&B run's file."""
    history = {}
    for record in closed_run_records(path):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[record.history.step.num] = items
    return history


def test_offline_wandb_run_holds_each_steps_metrics_as_jsonl_does(tmp_path, quiet_wandb, caplog):
    quiet_wandb.setenv("WANDB_MODE", "offline")
    with caplog.at_level(logging.INFO, logger="levanter.trainer.tracker.wandb"):
        jsonl = train_briefly(tmp_path / "run", ("jsonl", "wandb"))
    [run_file] = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert os.path.dirname(run_file) in caplog.text  # the log line says where the offline run is

    history = wandb_history(run_file)
    assert sorted(history) == list(range(1, STEPS + 1))
    for step, logged in history.items():
        for name in COMPARED:
            assert logged[name] == jsonl[step][name], (step, name)
    assert not [r for r in caplog.records if r.name.startswith("levanter") and r.levelno >= logging.WARNING]

    [config] = [r.run.config for r in closed_run_records(run_file) if r.WhichOneof("record_type") == "run"]
    trainer = {item.key: json.loads(item.value_json) for item in config.update}["trainer"]
    assert trainer["num_train_steps"] == STEPS  # the run's configuration goes with it


def test_environment_turns_wandb_on_without_naming_it(tmp_path, quiet_wandb):
    quiet_wandb.setenv("WANDB_MODE", "offline")
    jsonl = train_briefly(tmp_path / "run", ("jsonl",))
    [run_file] = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert {step: logged["loss"] for step, logged in wandb_history(run_file).items()} == {
        step: record["loss"] for step, record in jsonl.items()
    }


@pytest.mark.timeout(180)
def test_a_wandb_that_cannot_start_neither_blocks_nor_fails_the_run(tmp_path, quiet_wandb, caplog):
    # Online, with no API key and a server address where nothing listens.
    quiet_wandb.setenv("WANDB_MODE", "online")
    quiet_wandb.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    quiet_wandb.setenv("WANDB_INIT_TIMEOUT", "20")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="levanter.trainer.tracker.wandb"):
        jsonl = train_briefly(tmp_path / "run", ("jsonl", "wandb"))
    assert time.monotonic() - started < 120
    assert sorted(jsonl) == list(range(1, STEPS + 1))
    [warning] = [r for r in caplog.records if r.name.startswith("levanter") and r.levelno >= logging.WARNING]
    assert "W&B could not start" in warning.getMessage() and "metrics.jsonl" in warning.getMessage()


class FailingRun:
    disabled = offline = False

    def __init__(self):
        self.calls = 0

    def log(self, metrics, step):
        self.calls += 1
        raise ConnectionError("server went away")

    def finish(self):
        raise AssertionError("a run that failed is not finished again")


def test_a_wandb_failure_mid_run_warns_once_and_stops_logging(tmp_path, quiet_wandb, caplog):
    import wandb

    run = FailingRun()
    quiet_wandb.setattr(wandb, "init", lambda **kwargs: run)
    trackers = build_trackers(["jsonl", "wandb"], metrics_path=str(tmp_path / "m.jsonl"), log_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="levanter.trainer.tracker.wandb"):
        for step in (1, 2, 3):
            trackers.log(step, {"loss": 1.0 / step})
        trackers.close()
    assert run.calls == 1
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "W&B failed at step 1 (ConnectionError: server went away)"
    ]
    assert [r["step"] for r in read_metrics(str(tmp_path / "m.jsonl"))] == [1, 2, 3]


# -- which trackers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "names, environ, reporting, expected",
    [
        (("jsonl",), {}, True, ("jsonl",)),
        (("tensorboard",), {}, True, ("jsonl", "tensorboard")),  # jsonl always
        (("jsonl", "wandb"), {}, True, ("jsonl", "wandb")),
        (("jsonl",), {"WANDB_PROJECT": "p"}, True, ("jsonl", "wandb")),
        (("jsonl",), {"WANDB_MODE": "offline"}, True, ("jsonl", "wandb")),
        (("jsonl",), {"WANDB_MODE": "disabled"}, True, ("jsonl",)),
        (("jsonl",), {"WANDB_API_KEY": "k" * 40}, True, ("jsonl",)),  # a credential is not a request
        (("jsonl",), {"WANDB_PROJECT": "p"}, False, ("jsonl",)),  # only the reporting process
    ],
)
def test_which_trackers_a_run_uses(names, environ, reporting, expected):
    assert resolve_tracker_names(names, environ=environ, reporting=reporting) == expected


def test_wandb_asked_for_by_the_environment_but_not_installed_is_skipped_with_a_warning(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with caplog.at_level(logging.WARNING, logger="levanter.trainer.tracker"):
        assert resolve_tracker_names(("jsonl",), environ={"WANDB_PROJECT": "p"}, reporting=True) == ("jsonl",)
    assert "WANDB_PROJECT is set but wandb is not installed" in caplog.text


@pytest.mark.parametrize(
    "name, hidden, advice",
    [("tensorboard", ("torch.utils.tensorboard", "tensorboardX"), "pip install tensorboard"), ("wandb", ("wandb",), "pip install wandb")],
)
def test_a_named_tracker_whose_package_is_missing_says_what_to_install(name, hidden, advice, tmp_path, monkeypatch):
    for module in hidden:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail as if not installed
    with pytest.raises(TrackerUnavailableError, match=advice):
        build_trackers(["jsonl", name], metrics_path=str(tmp_path / "m.jsonl"), log_dir=str(tmp_path))
