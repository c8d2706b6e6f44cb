"""``TrainerConfig(profile=ProfileConfig(...))`` writes a ``jax.profiler`` trace of the chosen steps
into ``<run>/profile/``, on local disk or any URL, for TensorBoard/XProf and Perfetto."""

import gzip
import json

import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import ProfileConfig, Trainer, TrainerConfig, TrainerConfigError
from levanter.trainer.sources import InMemoryWindows
from rigging import filesystem as fsx

VOCAB, SEQ = 64, 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


def _train(output: str, profile: ProfileConfig | None, steps: int = 4):
    config = TrainerConfig(num_train_steps=steps, batch_size=8, checkpoint_at_end=False, profile=profile)
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 32), seq_len=SEQ, batch_size=8, seed=0)
    return Trainer(config, AdamConfig(1e-2), output_dir=output).train(lambda key: TINY.build(VOCAB, key=key), source)


def _trace_files(profile_url: str) -> list[str]:
    return sorted(fsx.find_files(profile_url)) if fsx.exists(profile_url) else []


@pytest.mark.parametrize("where", ["local", "memory"])
def test_profiled_steps_leave_a_tensorboard_and_a_perfetto_trace_in_the_run_folder(tmp_path, where):
    output = str(tmp_path / "run") if where == "local" else f"memory://{tmp_path.name}/run"
    result = _train(output, ProfileConfig(start_step=2, num_steps=2))
    assert result.final_step == 4
    profile = fsx.join(output, "profile")
    files = _trace_files(profile)
    # TensorBoard's profile plugin (and XProf) read plugins/profile/<run>/<host>.xplane.pb.
    xplanes = [name for name in files if name.startswith("plugins/profile/") and name.endswith(".xplane.pb")]
    assert xplanes, files
    perfetto = [name for name in files if name.endswith(".trace.json.gz")]
    assert perfetto, files
    with fsx.open_url(fsx.join(profile, perfetto[0]), "rb") as f:
        events = json.loads(gzip.decompress(f.read()))["traceEvents"]
    names = " ".join(str(event.get("name", "")) for event in events)
    assert "train_step" in names


def test_no_profile_by_default_and_a_window_past_the_run_is_skipped(tmp_path):
    _train(str(tmp_path / "plain"), None)
    assert not _trace_files(fsx.join(str(tmp_path / "plain"), "profile"))
    _train(str(tmp_path / "late"), ProfileConfig(start_step=10, num_steps=2))
    assert not _trace_files(fsx.join(str(tmp_path / "late"), "profile"))


def test_profile_settings_are_checked_and_survive_a_json_round_trip():
    with pytest.raises(TrainerConfigError, match="start_step"):
        ProfileConfig(start_step=0, num_steps=2)
    with pytest.raises(TrainerConfigError, match="num_steps"):
        ProfileConfig(start_step=3, num_steps=0)
    config = TrainerConfig(num_train_steps=10, batch_size=4, profile=ProfileConfig(start_step=3, num_steps=2))
    assert TrainerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
