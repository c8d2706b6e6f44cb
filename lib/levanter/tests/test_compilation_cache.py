"""``train_lm`` keeps JAX's compiled programs in a persistent cache in the user's cache folder, so a
rerun (another ``num_train_steps``, another learning rate or schedule) loads its train step
instead of compiling it again."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from levanter.trainer.compilation_cache import CACHE_ENV, compilation_cache_dir

CHILD = textwrap.dedent(
    """
    import logging, sys
    import numpy as np
    # JAX reports each persistent-cache hit and write at DEBUG.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("jax._src.compiler").setLevel(logging.DEBUG)
    logging.getLogger("jax._src.compilation_cache").setLevel(logging.DEBUG)

    from levanter.main.train_lm import TrainLmConfig, train_lm
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.trainer import TrainerConfig
    from levanter.trainer.sources import InMemoryWindows

    output, steps = sys.argv[1], int(sys.argv[2])
    config = TrainLmConfig(
        model=LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=16),
        # A cosine schedule with warm-up: its shape depends on num_train_steps.
        optimizer=AdamConfig(learning_rate=1e-2, warmup=0.25),
        trainer=TrainerConfig(num_train_steps=steps, batch_size=8, checkpoint_at_end=False),
        vocab_size=64,
        output_path=output,
        export_hf=False,
    )
    source = InMemoryWindows(np.tile(np.arange(64), 32), seq_len=16, batch_size=8, seed=0)
    train_lm(config, source)
    """
)


def _train(tmp_path: Path, name: str, steps: int) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", CACHE_ENV)}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / name), str(steps)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stderr


def _cache_entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


@pytest.mark.slow
def test_a_rerun_with_more_steps_loads_the_train_step_from_the_default_cache(tmp_path):
    cache = tmp_path / "xdg-cache" / "marin" / "jax-compilation-cache"
    first = _train(tmp_path, "run-4-steps", steps=4)
    train_steps = {name for name in _cache_entries(cache) if name.startswith("jit_train_step")}
    assert train_steps, f"no train step in {cache}: {sorted(_cache_entries(cache))}\n{first[-2000:]}"
    assert "Persistent compilation cache hit for 'jit_train_step'" not in first

    second = _train(tmp_path, "run-6-steps", steps=6)
    assert "Persistent compilation cache hit for 'jit_train_step'" in second, second[-3000:]
    assert "PERSISTENT COMPILATION CACHE MISS for 'jit_train_step'" not in second
    # Nothing new was compiled for the train step: the entries are those of the first run.
    assert {name for name in _cache_entries(cache) if name.startswith("jit_train_step")} == train_steps


def test_cache_folder_follows_xdg_and_home(tmp_path):
    assert compilation_cache_dir({"XDG_CACHE_HOME": "/x/cache", "HOME": "/home/u"}) == "/x/cache/marin/jax-compilation-cache"
    assert compilation_cache_dir({"HOME": "/home/u"}) == "/home/u/.cache/marin/jax-compilation-cache"


def test_cache_folder_can_be_moved_or_turned_off(tmp_path):
    env = {"HOME": "/home/u"}
    assert compilation_cache_dir({**env, CACHE_ENV: str(tmp_path / "jax")}) == str(tmp_path / "jax")
    for off in ("", "off", "OFF"):
        assert compilation_cache_dir({**env, CACHE_ENV: off}) is None


def test_a_cache_folder_set_for_jax_itself_is_left_alone():
    # JAX reads JAX_COMPILATION_CACHE_DIR itself (the test suite sets one); ours must not replace it.
    assert compilation_cache_dir({"HOME": "/home/u", "JAX_COMPILATION_CACHE_DIR": "/elsewhere"}) is None
