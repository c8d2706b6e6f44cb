"""KV-cached sampling agrees with full recomputation and honours its filters and EOS."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.inference import init_cache, decode, sample
from levanter.inference.sampling import SamplingError, _choose
from levanter.models import LlamaConfig, MoeConfig

VOCAB = 64
# Scanned layers here, unrolled for the MoE below, so both decode paths run.
CONFIG = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64, use_scan=True)


@pytest.fixture(scope="module")
def model():
    return CONFIG.build(VOCAB, key=jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def prompt():
    return jax.random.randint(jax.random.PRNGKey(1), (2, 5), 0, VOCAB, dtype=jnp.int32)


def _greedy_by_recomputation(model, prompt, steps):
    forward = jax.jit(lambda m, t: m(t))
    tokens = prompt
    for _ in range(steps):
        padded = jnp.pad(tokens, ((0, 0), (0, 12 - tokens.shape[1])))  # one compiled shape
        next_token = jnp.argmax(forward(model, padded)[:, tokens.shape[1] - 1], axis=-1)
        tokens = jnp.concatenate([tokens, next_token[:, None].astype(jnp.int32)], axis=1)
    return tokens


def test_greedy_sampling_matches_full_recomputation_and_stops_at_eos(model, prompt):
    reference = _greedy_by_recomputation(model, prompt, 6)
    eos = int(reference[0, 7])  # row 0's third new token
    out = sample(model, prompt, max_new_tokens=6, temperature=0.0, eos_id=eos)
    assert out.shape == (2, 11)
    np.testing.assert_array_equal(out[0, :8], reference[0, :8])
    assert (out[0, 8:] == eos).all()
    row1 = np.asarray(reference[1])
    stop = next((i for i in range(5, 11) if row1[i] == eos), 10) + 1
    np.testing.assert_array_equal(out[1, :stop], row1[:stop])
    assert (out[1, stop:] == eos).all()


def test_cached_prefill_matches_forward(model, prompt):
    logits, cache = jax.jit(decode)(model, prompt, init_cache(model, 2, 8), 0)
    np.testing.assert_allclose(logits, jax.jit(lambda m, t: m(t))(model, prompt), atol=1e-5)
    assert cache.keys.shape == (2, 2, 8, 2, 8) and float(jnp.abs(cache.keys[:, :, 5:]).max()) == 0.0


def test_filters_restrict_the_sampled_tokens():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 2000))
    keys = jax.random.PRNGKey(0)
    one = jnp.float32(1.0)
    top2 = _choose(logits, keys, one, one, greedy=False, top_k=2, use_top_p=False)
    assert set(np.unique(top2)) == {0, 1}
    nucleus = _choose(logits, keys, one, jnp.float32(0.6), greedy=False, top_k=None, use_top_p=True)
    assert set(np.unique(nucleus)) == {0, 1}  # 0.5 < 0.6 so the second token is needed, not the third
    free = _choose(logits, keys, one, one, greedy=False, top_k=None, use_top_p=False)
    assert set(np.unique(free)) == {0, 1, 2, 3}
    assert abs(float(jnp.mean(free == 0)) - 0.5) < 0.05


def test_moe_and_single_prompt_and_errors(model):
    moe = MoeConfig(hidden_dim=16, intermediate_dim=24, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=4, num_experts_per_token=2, max_seq_len=32)
    moe_model = moe.build(VOCAB, key=jax.random.PRNGKey(2))
    out = sample(moe_model, jnp.array([1, 2, 3]), max_new_tokens=3, temperature=0.8, key=jax.random.PRNGKey(3))
    assert out.shape == (6,) and list(out[:3]) == [1, 2, 3]
    with pytest.raises(SamplingError, match="max_seq_len"):
        sample(model, jnp.zeros((1, 60), jnp.int32), max_new_tokens=10, temperature=0.0)
    with pytest.raises(SamplingError, match="PRNG key"):
        sample(model, jnp.array([1]), max_new_tokens=2)
