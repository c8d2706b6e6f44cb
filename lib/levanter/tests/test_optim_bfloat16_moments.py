"""``AdamConfig(moment_dtype="bfloat16")``: Adam's moments stored in bfloat16, rounded stochastically,
computed in float32. Rounding is right on average, a slow moving average keeps moving where rounding
to nearest would stall it, and a small Llama trains as with float32 moments, resuming from its
checkpoints as it ran."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig, OptimizerConfigError
from levanter.optim.narrow_state import stochastic_round_to_bfloat16, stored_in_bfloat16
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows

# bfloat16 keeps 8 significant bits: one unit in the last place of x in [2^e, 2^(e+1)) is 2^(e-7).
SIGNIFICANT_BITS = 8


def unit(x):
    return 2.0 ** (np.floor(np.log2(np.abs(x))) - (SIGNIFICANT_BITS - 1))


def test_stochastic_rounding_lands_on_a_neighbour_and_is_right_on_average():
    base = np.array([1.0, -3.0, 1.25 * 2.0**-66, 1.5 * 2.0**16, -1.0], np.float64)  # exact in bfloat16
    fraction = np.array([0.25, 0.5, 0.75, 0.125, 0.875])
    x = base + np.sign(base) * fraction * unit(base)
    draws = 4096
    rounded = jax.vmap(lambda k: stochastic_round_to_bfloat16(jnp.asarray(x, jnp.float32), k))(
        jax.random.split(jax.random.PRNGKey(1), draws))
    assert rounded.dtype == jnp.bfloat16
    rounded = np.asarray(rounded, np.float64)
    up = base + np.sign(base) * unit(base)
    assert np.all((rounded == base) | (rounded == up))
    # Each draw is one of two values a unit apart: the mean of n draws has a standard error of at most
    # unit / (2 sqrt(n)). Five of those (rounding to nearest is off by 0.125 to 0.5 units here).
    np.testing.assert_array_less(np.abs(rounded.mean(axis=0) - x), 5 * unit(base) / (2 * np.sqrt(draws)))


def test_a_slow_second_moment_keeps_moving_where_rounding_to_nearest_stalls_it():
    beta2, steps, size = 0.999, 1000, 1024
    start = 2.0  # the second moment before; the squared gradient from now on is 1
    expected = 1.0 + (start - 1.0) * beta2**steps  # 1.368

    def second_moment_after(tx):
        params = jnp.zeros(size)
        state = tx.init(params)
        state = state._replace(inner=state.inner._replace(nu=jnp.full(size, start, state.inner.nu.dtype)))

        def step(state, _):
            return tx.update(jnp.ones(size), state, params)[1], None

        return np.asarray(jax.lax.scan(step, state, None, length=steps)[0].inner.nu, np.float64)

    adam = optax.scale_by_adam(b1=0.9, b2=beta2)
    stochastic = second_moment_after(stored_in_bfloat16(adam))
    nearest = second_moment_after(stored_in_bfloat16(adam, stochastic=False))
    # 2 * 0.999 + 0.001 = 1.999 is nearer 2 than 2 - 2^-7: rounding to nearest never leaves 2.
    assert np.all(nearest == start)
    # Each step's rounding error is zero on average, under a unit (2^-7 in [1, 2)); it decays by beta2
    # a step, so an element's error has a standard deviation of at most unit / (2 sqrt(1 - beta2^2))
    # = 0.09, and the mean of the 1,024 elements one of 0.0027: five of those.
    bound = 5 * 2.0**-7 / (2 * np.sqrt(1 - beta2**2)) / np.sqrt(size)
    assert abs(stochastic.mean() - expected) < bound
    assert np.all((stochastic > 1.0) & (stochastic < start))


def test_the_moment_dtype_is_float32_or_bfloat16():
    with pytest.raises(OptimizerConfigError, match="moment_dtype"):
        AdamConfig(1e-3, moment_dtype="float16")


VOCAB, SEQ = 64, 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ, use_scan=True)


def train(output_dir, moment_dtype, *, steps, offload=False, lr_schedule="cosine"):
    config = TrainerConfig(num_train_steps=steps, batch_size=8, mesh=MeshConfig(data=1), log_every=1,
                           offload_optimizer_state=offload)
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8)
    optimizer = AdamConfig(3e-3, 0.1, moment_dtype=moment_dtype, lr_schedule=lr_schedule)
    return Trainer(config, optimizer, output_dir=str(output_dir)).train(lambda key: TINY.build(VOCAB, key=key), source)


def moments(result):
    return result.state.opt_state[1].inner if hasattr(result.state.opt_state[1], "inner") else result.state.opt_state[1]


def losses(result):
    return np.array([row["loss"] for row in result.history if "loss" in row])


def test_bfloat16_moments_are_stored_as_such_and_train_as_float32_moments_do(tmp_path):
    steps = 20
    wide = train(tmp_path / "float32", "float32", steps=steps)
    narrow = train(tmp_path / "bfloat16", "bfloat16", steps=steps)
    assert {x.dtype for x in jax.tree.leaves((moments(narrow).mu, moments(narrow).nu))} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves((moments(wide).mu, moments(wide).nu))} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(narrow.state.params)} == {jnp.dtype(jnp.float32)}
    wide_loss, narrow_loss = losses(wide), losses(narrow)
    assert len(wide_loss) == len(narrow_loss) == steps
    # The first step's update comes from moments computed in float32, before they are stored: the
    # same first step, and so the same loss at the second.
    np.testing.assert_allclose(narrow_loss[:2], wide_loss[:2], rtol=1e-6)
    # From then on each stored moment is off by under a unit of bfloat16 (2^-7 of it), so each Adam
    # step m / sqrt(v) by under 1.5 x 2^-7 = 1.2%: to first order, the loss after N steps differs by
    # about that share of the way it has come down. Four times that share, for the second order.
    progress = wide_loss[0] - wide_loss[-1]
    assert progress > 1.0
    assert abs(narrow_loss[-1] - wide_loss[-1]) < 4 * 1.5 * 2.0**-7 * progress


def test_a_run_with_offloaded_bfloat16_moments_resumes_from_its_checkpoint_as_it_ran(tmp_path):
    # A constant rate: stopping after 3 of 6 steps changes nothing else of the run.
    whole = train(tmp_path / "whole", "bfloat16", steps=6, offload=True, lr_schedule="constant")
    train(tmp_path / "resumed", "bfloat16", steps=3, offload=True, lr_schedule="constant")
    resumed = train(tmp_path / "resumed", "bfloat16", steps=6, offload=True, lr_schedule="constant")
    assert resumed.resumed_from == 3
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(resumed.state.opt_state)} == {"pinned_host"}
    # The rounding key is part of the state: the resumed run rounds as the whole one did.
    for x, y in zip(jax.tree.leaves((whole.state.params, whole.state.opt_state)),
                    jax.tree.leaves((resumed.state.params, resumed.state.opt_state)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
