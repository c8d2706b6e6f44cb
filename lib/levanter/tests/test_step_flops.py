"""The matmul FLOPs of a step, read from the program JAX lowers (levanter.trainer.step_flops), against
counts done by hand; and XLA's refusal for lack of memory read into DoesNotFit.

The programs here are lowered for this machine's CPU devices (conftest: eight simulated ones); the
same reading of TPU programs is checked against the models' own arithmetic in test_compile_for_tpu.py.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from levanter.trainer.ahead_of_time import DoesNotFit
from levanter.trainer.hlo_text import parse_hlo
from levanter.trainer.step_flops import count_step_flops

B, K, N, LAYERS = 8, 16, 32, 5


def lowered_text(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text(dialect="hlo")


def scanned_matmuls(x, ws):
    def layer(h, w):
        return jnp.tanh(h @ w), None

    return jax.lax.scan(layer, x, ws)[0]


def test_a_scanned_matmul_counts_once_per_layer():
    x, ws = jnp.ones((B, K)), jnp.ones((LAYERS, K, K))
    assert count_step_flops(lowered_text(scanned_matmuls, x, ws), num_devices=1).per_chip == LAYERS * 2 * B * K * K


def test_the_backward_pass_of_a_scan_counts_its_two_matmuls_per_layer():
    # d/dh and d/dw of h @ w are one matmul each, the size of the forward's.
    x, ws = jnp.ones((B, K)), jnp.ones((LAYERS, K, K))
    text = lowered_text(jax.grad(lambda x, ws: scanned_matmuls(x, ws).sum(), argnums=(0, 1)), x, ws)
    assert count_step_flops(text, num_devices=1).per_chip == 3 * LAYERS * 2 * B * K * K


def test_a_loops_body_runs_as_many_times_as_its_condition_says():
    # Lowered programs carry no trip count yet; the condition compares the counter with it.
    program = parse_hlo(lowered_text(scanned_matmuls, jnp.ones((B, K)), jnp.ones((LAYERS, K, K))))
    (loop,) = [i for c in program.computations.values() for i in c.instructions if i.opcode == "while"]
    body = re.search(r"body=%?([\w.\-]+)", loop.attributes).group(1)
    assert program.executions()[body] == LAYERS


def test_a_partitioned_matmul_is_shared_evenly_by_the_chips():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data", None))
    x = jax.ShapeDtypeStruct((B, K), jnp.float32, sharding=rows)
    w = jax.ShapeDtypeStruct((K, N), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    text = lowered_text(lambda x, w: x @ w, x, w)
    assert count_step_flops(text, num_devices=4).per_chip == 2 * B * K * N / 4


def test_a_shard_map_body_is_already_one_chips_share():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))

    def local(x, w):  # each device's rows only: [B / 4, K] @ [K, N]
        return x @ w

    mapped = jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec("data", None), PartitionSpec()),
                           out_specs=PartitionSpec("data", None))
    text = lowered_text(mapped, jnp.ones((B, K)), jnp.ones((K, N)))
    assert "manual_computation_body" in text
    assert count_step_flops(text, num_devices=4).per_chip == 2 * (B // 4) * K * N


def test_a_convolution_counts_its_window_and_input_features():
    image, kernel = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4))  # NHWC, HWIO

    def convolve(image, kernel):
        return jax.lax.conv_general_dilated(image, kernel, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    outputs = 2 * 6 * 6 * 4
    assert count_step_flops(lowered_text(convolve, image, kernel), num_devices=1).per_chip == 2 * outputs * (3 * 3 * 3)


@pytest.mark.parametrize("message, needed, available", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (39.51G) exceeds "
     "available HBM (15.75G).", 39.51, 15.75),
    ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of memory in memory space "
     "hbm. Used 15.79G of 15.75G hbm. Exceeded hbm capacity by 44.34M.", 15.79, 15.75),
])
def test_xlas_refusal_for_memory_reads_as_does_not_fit_with_its_figures_in_gib(message, needed, available):
    # XLA's "G" is a GiB: a 16.95e9-byte output on a v5e chip is reported as 15.79G.
    refusal = DoesNotFit.read(RuntimeError(message + "\nmore lines"))
    assert refusal is not None and not refusal.fits
    assert refusal.needed_bytes == int(needed * 2**30) and refusal.available_bytes == int(available * 2**30)
    assert refusal.message == message


def test_other_compile_errors_are_not_read_as_memory():
    assert DoesNotFit.read(RuntimeError("INVALID_ARGUMENT: Mosaic failed to compile TPU kernel")) is None
    assert DoesNotFit.read(RuntimeError("RESOURCE_EXHAUSTED: too many open files")) is None
