"""Rematerialisation policies (``remat`` in LlamaConfig / MoeConfig): the numbers of no remat, for
less activation memory, and the deprecated ``gradient_checkpointing`` flag."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.models import ConfigError, LlamaConfig, MoeConfig, next_token_loss
from levanter.models.transformer import REMAT_POLICIES

VOCAB = 96
LLAMA = LlamaConfig(hidden_dim=32, intermediate_dim=96, num_layers=3, num_heads=4, num_kv_heads=2, max_seq_len=64)
MOE = MoeConfig(hidden_dim=16, intermediate_dim=24, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=4, max_seq_len=64)


def _loss(model, tokens):
    out = model.forward(tokens)
    sums = next_token_loss(out.logits, tokens, jnp.ones(tokens.shape, jnp.float32))
    return sums.loss_sum / sums.weight_sum + out.aux_loss


def _loss_and_grads(config, tokens):
    model = config.build(VOCAB, key=jax.random.PRNGKey(0))
    return jax.jit(jax.value_and_grad(_loss))(model, tokens)


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.PRNGKey(1), (2, 24), 0, VOCAB, dtype=jnp.int32)


@pytest.mark.parametrize("remat", [p for p in REMAT_POLICIES if p != "none"])
@pytest.mark.parametrize("base", [LLAMA, dataclasses.replace(LLAMA, use_scan=True), MOE], ids=["llama", "llama-scan", "moe"])
def test_every_policy_gives_the_loss_and_gradients_of_no_remat(base, remat, tokens):
    loss, grads = _loss_and_grads(base, tokens)
    loss_r, grads_r = _loss_and_grads(dataclasses.replace(base, remat=remat), tokens)
    # The backward pass recomputes the same float32 operations; only XLA's fusion of them may
    # differ, which reorders a few sums: a few float32 ulps of the values summed (a gradient entry
    # sums 2 x 24 token terms, so sqrt(48) ~ 7 ulps is the expected size; 1e-5 relative is ~80).
    np.testing.assert_allclose(loss_r, loss, rtol=1e-6)
    for path, g, g_r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads), jax.tree.leaves(grads_r)):
        scale = float(jnp.max(jnp.abs(g))) + 1e-30
        np.testing.assert_allclose(g_r, g, rtol=1e-5, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path[0]))


def _temp_bytes(config, batch: int, seq_len: int) -> int:
    """Scratch memory XLA plans for one gradient of the mean loss (compiled, never run)."""
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    model = jax.eval_shape(lambda: config.build(VOCAB, key=jax.random.PRNGKey(0)))
    compiled = jax.jit(jax.grad(_loss)).lower(model, tokens).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        pytest.skip("this backend gives no memory analysis")
    return int(analysis.temp_size_in_bytes)


def test_remat_lowers_the_activation_memory_of_a_gradient():
    # Enough tokens and layers that the layers' activations dominate the scratch memory (many short
    # rows rather than a few long ones: as many tokens, compiled in half the time).
    config = dataclasses.replace(LLAMA, num_layers=4, max_seq_len=128, use_scan=True)
    temp = {remat: _temp_bytes(dataclasses.replace(config, remat=remat), batch=16, seq_len=128) for remat in REMAT_POLICIES}
    # "full" keeps one [B, T, embed] input per layer; "save_matmuls" also the projections' outputs,
    # while attention scores and elementwise results are recomputed.
    assert temp["full"] < temp["save_matmuls"] < temp["none"], temp
    assert temp["full"] < 0.5 * temp["none"], temp
    # Off a TPU attention is not the splash kernel, so there is nothing more for it to keep.
    assert temp["save_attention"] == temp["full"], temp


def test_unknown_policy_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="remat.*'none', 'full', 'save_matmuls'"):
        dataclasses.replace(LLAMA, remat="everything")
    with pytest.raises(ConfigError, match="remat"):
        dataclasses.replace(MOE, remat=True)


def test_gradient_checkpointing_is_a_deprecated_spelling_of_full_remat():
    fields = {f.name: getattr(LLAMA, f.name) for f in dataclasses.fields(LLAMA)}
    with pytest.warns(DeprecationWarning, match='remat="full"'):
        old = LlamaConfig(**{**fields, "gradient_checkpointing": True})
    assert old.remat == "full" and old == dataclasses.replace(LLAMA, remat="full")
    with pytest.warns(DeprecationWarning):
        assert dataclasses.replace(MOE, gradient_checkpointing=True).remat == "full"
    # False asked for nothing: the config's own remat stands (HF import passes False by default).
    assert dataclasses.replace(LLAMA, remat="save_matmuls", gradient_checkpointing=False).remat == "save_matmuls"
    # Only remat is recorded (hashes, run configs), under one name.
    assert "gradient_checkpointing" not in old.to_dict() and old.to_dict()["remat"] == "full"
    with pytest.raises(ConfigError, match="gradient_checkpointing=True.*remat='save_matmuls'"):
        dataclasses.replace(LLAMA, remat="save_matmuls", gradient_checkpointing=True)
