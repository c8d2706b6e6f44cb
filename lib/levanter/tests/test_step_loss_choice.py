"""The train step's choice between the plain and the fused cross-entropy, and their agreement."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from levanter.models.llama import LlamaConfig
from levanter.trainer.state import TrainState
from levanter.trainer.step import FUSED_LOSS_MAX_HIDDEN, FUSED_LOSS_MIN_LOGITS, DeviceBatch, build_step_functions, prefers_fused_loss

VOCAB, SEQ, BATCH = 97, 24, 4


def llama(hidden_dim: int, vocab: int = VOCAB):
    config = LlamaConfig(hidden_dim=hidden_dim, intermediate_dim=2 * hidden_dim, num_layers=2, num_heads=2, num_kv_heads=1, max_seq_len=SEQ)
    return config.build(vocab, key=jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def narrow():
    return llama(32)


def test_rule_picks_the_fused_loss_only_for_narrow_models_with_large_logits_on_one_device(narrow):
    wide = eqx.filter_jit(lambda: llama(2 * FUSED_LOSS_MAX_HIDDEN))()
    many_tokens = -(-FUSED_LOSS_MIN_LOGITS // VOCAB)  # e.g. 4 x 2048 tokens of a 4k vocabulary
    assert prefers_fused_loss(narrow, num_tokens=many_tokens, num_devices=1)
    assert not prefers_fused_loss(narrow, num_tokens=many_tokens - 1, num_devices=1)  # logits fit in cache
    assert not prefers_fused_loss(narrow, num_tokens=many_tokens, num_devices=8)
    assert not prefers_fused_loss(wide, num_tokens=many_tokens, num_devices=1)
    assert not prefers_fused_loss(object(), num_tokens=many_tokens, num_devices=1)  # no hidden_states/unembedding


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)
    mask = (rng.random((BATCH, SEQ)) < 0.8).astype(np.float32)
    segment_ids = np.repeat([[0, 1, 2]], BATCH, axis=0).repeat([10, 9, 5], axis=1).astype(np.int32)
    return DeviceBatch(tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(mask), segment_ids=jnp.asarray(segment_ids))


def test_fused_and_plain_loss_give_the_same_step(batch, narrow):
    params, static = eqx.partition(narrow, eqx.is_inexact_array)
    optimizer = optax.sgd(1.0)  # new params = params - gradient: compares the gradients
    results = {}
    for fused in (False, True):
        steps = build_step_functions(
            static_model=static, optimizer=optimizer, lr_schedule=lambda step: 1.0, compute_dtype=jnp.float32,
            z_loss_weight=1e-2, num_microbatches=1, fused_loss=fused,
        )
        state = TrainState(step=jnp.int32(0), params=jax.tree.map(jnp.copy, params), opt_state=optimizer.init(params), key=jax.random.PRNGKey(1))
        new_state, metrics = steps.train_step(state, batch)
        eval_loss, eval_weight = steps.eval_step(params, batch)
        results[fused] = (new_state.params, metrics, float(eval_loss), float(eval_weight))

    (p_plain, m_plain, e_plain, w_plain), (p_fused, m_fused, e_fused, w_fused) = results[False], results[True]
    for name in ("loss", "z_loss", "total_loss", "grad_norm", "loss_tokens"):
        np.testing.assert_allclose(m_fused[name], m_plain[name], rtol=1e-5, err_msg=name)
    assert m_plain["loss"] > 1.0  # a real loss was computed, not an empty sum
    np.testing.assert_allclose(e_fused, e_plain, rtol=1e-5)
    assert w_fused == w_plain > 0
    for a, b in zip(jax.tree.leaves(p_fused), jax.tree.leaves(p_plain)):
        np.testing.assert_allclose(a, b, atol=1e-5)
