"""``TrainerConfig.offload_optimizer_state``: the optimizer's state lives in the host's memory between
steps, the same numbers are computed, and a run resumes from its checkpoint as before. Compiled for a
TPU, the state leaves the chip's memory (it is counted in the host's)."""

import importlib.util

import jax
import numpy as np
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows

VOCAB, SEQ = 64, 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ, use_scan=True)


def source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8)


def train(output_dir, *, steps, offload):
    config = TrainerConfig(num_train_steps=steps, batch_size=8, mesh=MeshConfig(data=1), offload_optimizer_state=offload)
    return Trainer(config, AdamConfig(3e-3, 0.1), output_dir=str(output_dir)).train(lambda key: TINY.build(VOCAB, key=key), source())


def assert_same_arrays(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_an_offloaded_optimizer_state_computes_the_same_run_and_resumes(tmp_path):
    plain = train(tmp_path / "plain", steps=6, offload=False)
    offloaded = train(tmp_path / "offloaded", steps=6, offload=True)
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(offloaded.state.opt_state)} == {"pinned_host"}
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(plain.state.opt_state)} == {"device"}
    assert_same_arrays(offloaded.state.params, plain.state.params)
    assert_same_arrays(offloaded.state.opt_state, plain.state.opt_state)

    # Stopped after 3 steps (its final checkpoint), then continued to 6, with and without the offload:
    # the restored state goes back to the host's memory, and the two runs end the same.
    resumed = {}
    for offload in (False, True):
        train(tmp_path / f"resumed-{offload}", steps=3, offload=offload)
        resumed[offload] = train(tmp_path / f"resumed-{offload}", steps=6, offload=offload)
        assert resumed[offload].resumed_from == 3
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(resumed[True].state.opt_state)} == {"pinned_host"}
    assert_same_arrays(resumed[True].state.params, resumed[False].state.params)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="compiling for a TPU without one needs libtpu (pip install '.[test]' installs it)")
def test_compiled_for_a_tpu_the_offloaded_state_is_in_the_hosts_memory():
    from levanter.trainer.ahead_of_time import compile_train_step, tpu_topology_devices

    devices = tpu_topology_devices("v5e:2x2")[:1]
    memory = {}
    for offload, moment_dtype in ((False, "float32"), (True, "float32"), (True, "bfloat16")):
        config = TrainerConfig(num_train_steps=10, batch_size=8, mesh=MeshConfig(data=1), offload_optimizer_state=offload)
        memory[offload, moment_dtype] = compile_train_step(
            lambda key: TINY.build(VOCAB, key=key), config, AdamConfig(3e-3, 0.1, moment_dtype=moment_dtype),
            seq_len=SEQ, devices=devices).memory
    moments = 2 * 4 * TINY.num_parameters(VOCAB)  # AdamW's two float32 moments
    assert memory[False, "float32"].host == 0
    assert memory[True, "float32"].host >= moments
    assert memory[False, "float32"].arguments - memory[True, "float32"].arguments >= moments
    # In bfloat16 the moments take half the host's memory (the chip's tiled layout pads both alike),
    # beside the rounding's key: a few bytes, padded to a tile.
    half = memory[True, "float32"].host // 2
    assert half <= memory[True, "bfloat16"].host < half + 4096
    assert memory[True, "bfloat16"].arguments == memory[True, "float32"].arguments
