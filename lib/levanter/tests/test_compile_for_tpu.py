"""Compile for TPUs on this CPU machine, with no chip: what would fail on the chip fails here.

libtpu (installed by the test extra, the version that goes with jaxlib) describes TPU topologies, and
XLA compiles for their devices the real TPU programs, Pallas kernels included
(``levanter.trainer.ahead_of_time``). Compiled here, for v5e, v5p and v6e:

- splash attention, forward and backward, in bfloat16 and float32, at the default matmul precision
  and under "highest" (where Mosaic once refused bfloat16 operands: "Bad lhs type");
- the blocked cross-entropy of the output layer;
- the whole training step of a Llama and of an MoE with scanned layers, under every remat policy,
  sharded fsdp over four chips, each reporting its compiled memory per chip (``record_property``;
  ``pytest --junitxml`` keeps it) and checked against a count from the config, and its matmul FLOPs
  per step (``levanter.trainer.step_flops``) against the config's own arithmetic;
- a step too large for its chips, read as DoesNotFit with the bytes XLA asked for.
"""

import dataclasses
import importlib.util
import re
import time

import jax
import jax.numpy as jnp

import pytest
from jax.sharding import NamedSharding, PartitionSpec

from haliax.nn import dot_product_attention
from haliax.partitioning import make_mesh, use_mesh
from levanter.models.llama import LlamaConfig
from levanter.models.loss import fused_next_token_loss
from levanter.models.moe import MoeConfig
from levanter.models.transformer import REMAT_POLICIES
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, TrainerConfig
from levanter.trainer.ahead_of_time import TOPOLOGY_PREFIXES as TOPOLOGY_KINDS
from levanter.trainer.ahead_of_time import DoesNotFit, compile_train_step, tpu_topology_devices
from levanter.trainer.step import prefers_fused_loss

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                       reason="compiling for a TPU without one needs libtpu (pip install '.[test]' installs it)"),
]

# Four chips of each generation; v5p's topologies are three-dimensional.
TOPOLOGIES = {"v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2"}
# 128 positions: one block of the splash kernel, its smallest (SPLASH_BLOCKS), where 512 would be one
# block of 512. Nothing asserted here depends on the length (which kernel is chosen and that it
# compiles, how often a step runs it, the state's bytes, matmul FLOPs per token), and a step's compile
# takes about half the CPU at 128 that it takes at 512 (the kernels' larger tiles).
B, T, H, KV, D = 8, 128, 4, 2, 128


def sharded(shape, dtype, sharding):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def test_every_tpu_slice_of_frays_table_is_a_topology_libtpu_describes():
    from fray.cluster.accelerators import tpu_slice, tpu_types

    for name in tpu_types():
        tpu = tpu_slice(name)
        if tpu.chips == 1:  # libtpu describes no single chip; a plan takes one device of a 2x2
            continue
        devices = tpu_topology_devices(tpu.topology)
        assert len(devices) == tpu.chips, (name, tpu.topology)
        assert devices[0].device_kind == TOPOLOGY_KINDS[tpu.generation.chip]
    # Several slices: each device knows its slice.
    two = tpu_topology_devices("v5e:2x2", slices=2)
    assert len(two) == 8 and {device.slice_index for device in two} == {0, 1}


def attention_program(devices, dtype):
    mesh = make_mesh(data=len(devices), devices=devices)
    rows = NamedSharding(mesh, PartitionSpec("data"))

    def forward_and_backward(q, k, v, segment_ids):
        def loss(q, k, v):
            return jnp.sum(dot_product_attention(q, k, v, segment_ids=segment_ids).astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    args = (sharded((B, T, H, D), dtype, rows), sharded((B, T, KV, D), dtype, rows), sharded((B, T, KV, D), dtype, rows),
            sharded((B, T), jnp.int32, rows))
    return mesh, forward_and_backward, args


@pytest.mark.parametrize("precision", ["default", "highest"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("generation", sorted(TOPOLOGIES))
def test_splash_attention_compiles_for_tpus_at_every_precision(generation, dtype, precision, record_property):
    devices = tpu_topology_devices(TOPOLOGIES[generation])
    mesh, program, args = attention_program(devices, dtype)
    with jax.default_matmul_precision(precision), use_mesh(mesh):
        lowered = jax.jit(program).lower(*args)
    assert "tpu_custom_call" in lowered.as_text(), "auto did not choose the splash kernel on a TPU mesh"
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    record_property("temp_bytes", int(memory.temp_size_in_bytes))
    # The gradients of q, k and v come out per chip, a quarter of the batch of each (plus the
    # output tuple's few bytes of index).
    itemsize = jnp.dtype(dtype).itemsize
    assert memory.output_size_in_bytes == pytest.approx(B // 4 * T * (H + 2 * KV) * D * itemsize, rel=1e-3)


def test_the_blocked_loss_compiles_for_a_tpu():
    """A 128k vocabulary over 4,096 tokens a chip: 2.1 GB of float32 logits per chip if materialised."""
    devices = tpu_topology_devices(TOPOLOGIES["v5e"])
    mesh = make_mesh(data=len(devices), devices=devices)
    rows, whole = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    seq_len, hidden, vocab = 2048, 256, 128_256

    def loss(h, w, tokens, mask):
        sums = fused_next_token_loss(h, w, tokens, mask, z_loss_weight=1e-4)
        return sums.loss_sum / sums.weight_sum

    args = (sharded((B, seq_len, hidden), jnp.bfloat16, rows), sharded((hidden, vocab), jnp.bfloat16, whole),
            sharded((B, seq_len), jnp.int32, rows), sharded((B, seq_len), jnp.float32, rows))
    with use_mesh(mesh):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < B // 4 * seq_len * vocab * 4


LLAMA = LlamaConfig(hidden_dim=256, intermediate_dim=512, num_layers=2, num_heads=2, num_kv_heads=1, max_seq_len=T, use_scan=True)
MOE = MoeConfig(hidden_dim=256, intermediate_dim=256, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=4,
                num_experts_per_token=2, max_seq_len=T, use_scan=True)
VOCAB = 1024


def expected_state_bytes_per_chip(config, chips: int) -> int:
    """Parameters and AdamW's two moments, float32, sharded over ``chips`` (fsdp): the step's
    arguments beyond a small remainder (step counter, key, batch)."""
    return 3 * 4 * config.num_parameters(VOCAB) // chips


def expected_matmul_flops_per_token(config, remat: str, tokens: int, chips: int) -> float:
    """The config's own count (``flops_per_token``: 6N + attention), less attention's products (in the
    splash kernel, which the FLOP count lists apart), plus the matmuls the remat policy reruns before
    each layer's backward, at 2 FLOPs per weight and token:

    - "full" and "save_attention" rerun the layer's forward: every matmul but the Llama MLP's down
      projection, whose output the backward does not need (an MoE's experts' down projections are
      rerun: the router weights' gradient needs the experts' outputs);
    - "save_matmuls" keeps the projections' outputs; an MoE reruns its experts' grouped matmuls,
      which that policy does not keep.

    The blocked loss, where the step uses it, reruns the output layer in its backward."""
    count = config.flops_per_token(VOCAB, T) - config.attention_flops_per_token(T)
    moe = isinstance(config, MoeConfig)
    experts = config.num_experts_per_token * config.expert_parameters() if moe else 0
    if remat in ("full", "save_attention"):
        router_and_mlp = config.hidden_dim * config.num_experts + experts if moe else 2 * config.hidden_dim * config.intermediate_dim
        count += 2 * config.num_layers * (config.attention_parameters() + router_and_mlp)
    elif remat == "save_matmuls":
        count += 2 * config.num_layers * experts
    if prefers_fused_loss(config, tokens, chips):
        count += 2 * VOCAB * config.hidden_dim
    return count


@pytest.mark.parametrize("remat", REMAT_POLICIES)
@pytest.mark.parametrize("family", ["llama", "moe"])
def test_the_training_step_compiles_for_a_v5e_slice_under_every_remat_policy(family, remat, record_property):
    config = dataclasses.replace(LLAMA if family == "llama" else MOE, remat=remat)
    devices = tpu_topology_devices(TOPOLOGIES["v5e"])
    trainer = TrainerConfig(num_train_steps=10, batch_size=B, mesh=MeshConfig(data=1, fsdp=len(devices)))
    step = compile_train_step(lambda key: config.build(VOCAB, key=key), trainer, AdamConfig(1e-3, 0.1),
                              seq_len=T, devices=devices)
    memory = step.memory
    for name, value in dataclasses.asdict(memory).items():
        record_property(name, value)
    assert step.device_kind == "TPU v5 lite" and step.num_devices == 4 and step.mesh["fsdp"] == 4
    # The state is donated: it comes in and goes out in the same buffers.
    assert memory.aliased >= 0.99 * expected_state_bytes_per_chip(config, 4)
    assert memory.arguments == pytest.approx(expected_state_bytes_per_chip(config, 4), rel=0.05)
    assert 0 < memory.total < 16 * 2**30
    # fsdp gathers each layer's weights and scatters its gradients: collectives in every layer.
    assert step.collectives.counts.get("all-gather", 0) >= config.num_layers
    # Matmul FLOPs per chip, loops at their trip counts, against the config's arithmetic. The program
    # also multiplies small things that count leaves out, a few thousand FLOPs per token and layer
    # beside the weights' 2 x 590k: the attention backward's per-head row sums (2 x heads x head_dim)
    # and, in the MoE, the products weighing each token's experts by its router weights (about
    # 3 x top-k x hidden): 0.01% of the Llama's step, 0.08% of the MoE's; hence 0.2%.
    record_property("flops_per_chip", step.step_flops.per_chip)
    expected = expected_matmul_flops_per_token(config, remat, B * T, 4) * B * T / 4
    assert step.step_flops.per_chip == pytest.approx(expected, rel=2e-3)
    # The splash kernel runs forward and backward in each layer, and forward again where remat reruns
    # attention ("full", "save_matmuls"); "save_attention" keeps its output instead.
    runs = 2 if remat in ("none", "save_attention") else 3
    assert step.step_flops.kernels == {"splash_attention": runs * config.num_layers}



def forward_attention_kernels(compiled) -> int:
    """How many splash forward kernels the compiled program runs per layer (the scan's body holds one
    layer): once for the forward pass, and once more in the backward where the layer is recomputed."""
    return len(re.findall(r"^\s*%splash_mha_fwd\S* = .* custom-call\(", compiled.as_text(), flags=re.MULTILINE))


def compile_on_one_chip(remat: str, memory_limit: int | None = None):
    """The Llama's step under ``remat`` for one v5e chip (a quarter of the batch)."""
    config = dataclasses.replace(LLAMA, remat=remat)
    trainer = TrainerConfig(num_train_steps=10, batch_size=B // 4, mesh=MeshConfig(data=1))
    return compile_train_step(lambda key: config.build(VOCAB, key=key), trainer, AdamConfig(1e-3, 0.1), seq_len=T,
                              devices=tpu_topology_devices(TOPOLOGIES["v5e"])[:1], memory_limit=memory_limit)


ONE_CHIP_MEMORY_LIMIT = 2**30


@dataclasses.dataclass(frozen=True)
class OneChipSteps:
    steps: dict  # remat policy -> its step compiled for one v5e chip
    cache_on: bool  # a new program compiled for the CPU went into JAX's persistent compilation cache
    written: list  # what that cache was given while the steps compiled for the TPU chip


@pytest.fixture(scope="module")
def one_chip():
    """Two steps for one chip, compiled once for the two tests below: "full" remat as for a chip of
    ONE_CHIP_MEMORY_LIMIT bytes (``memory_limit``; which kernels run is the policy's choice, not the
    limit's) and "save_attention"; and what JAX's persistent cache was given meanwhile."""
    from jax._src import compilation_cache

    written = []
    put = compilation_cache.put_executable_and_time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compilation_cache, "put_executable_and_time",
                      lambda key, name, *rest: (written.append(name), put(key, name, *rest)))
        unique = float(time.time_ns() % 999_983)  # a program compiled for the first time: not already in the cache
        jax.jit(lambda x: x * 3 + unique).lower(jnp.arange(7.0)).compile()  # on the CPU: kept, as the suite asks (conftest.py)
        cache_on = bool(written)
        written.clear()
        steps = {"full": compile_on_one_chip("full", memory_limit=ONE_CHIP_MEMORY_LIMIT),
                 "save_attention": compile_on_one_chip("save_attention")}
    return OneChipSteps(steps, cache_on, list(written))


def test_save_attention_keeps_the_backward_from_rerunning_the_attention_kernel_on_one_chip(one_chip):
    """On one chip the policy reaches inside the kernel, which names its residuals: the backward
    reads them instead of recomputing the attention, so the forward kernel runs once, not twice.
    (On four chips, where the kernel runs per shard, the kernel counts of the test above say the same.)"""
    kernels = {remat: forward_attention_kernels(step.compiled) for remat, step in one_chip.steps.items()}
    assert kernels == {"full": 2, "save_attention": 1}


def test_a_step_too_large_for_its_chips_does_not_fit_with_the_bytes_xla_asked_for():
    # 5.2B parameters on four v5e chips: the state alone (12 bytes a parameter) is 14.6 GiB a chip, the
    # gradients 4.9 more; a chip has 16.
    config = LlamaConfig(hidden_dim=4096, intermediate_dim=14336, num_layers=24, num_heads=32, num_kv_heads=8,
                         max_seq_len=T, use_scan=True)
    devices = tpu_topology_devices(TOPOLOGIES["v5e"])
    trainer = TrainerConfig(num_train_steps=10, batch_size=B, mesh=MeshConfig(data=1, fsdp=len(devices)))
    step = compile_train_step(lambda key: config.build(VOCAB, key=key), trainer, AdamConfig(1e-3, 0.1),
                              seq_len=T, devices=devices)
    assert isinstance(step, DoesNotFit) and not step.fits
    assert step.available_bytes == pytest.approx(15.75 * 2**30, rel=1e-3)  # v5e's 16 GiB less the runtime's share
    assert step.needed_bytes > 16 * config.num_parameters(VOCAB) / 4
    assert step.mesh["fsdp"] == 4 and step.device_kind == "TPU v5 lite"
    # The FLOPs are known without the compiled program: they come from the lowered one.
    assert step.step_flops.per_chip == pytest.approx(
        expected_matmul_flops_per_token(config, "none", B * T, 4) * B * T / 4, rel=2e-3)


def test_a_step_compiled_for_a_chip_with_less_memory_than_it_needs_does_not_fit(one_chip):
    """``memory_limit`` compiles as for a smaller chip: the headroom of a step is the limit it still fits.

    The steps compiled for the chip are not kept in JAX's persistent compilation cache, which could never
    load them (no chip)."""
    assert one_chip.cache_on, "JAX's persistent cache is not on in this process"
    assert one_chip.steps["full"].fits  # compiled under ONE_CHIP_MEMORY_LIMIT
    assert one_chip.written == []
    state_bytes = expected_state_bytes_per_chip(LLAMA, 1)  # 20 MB: parameters and AdamW's moments
    small = 8 * 2**20
    too_small = compile_on_one_chip("full", memory_limit=small)
    assert isinstance(too_small, DoesNotFit)
    assert too_small.available_bytes == small
    assert too_small.needed_bytes > state_bytes
