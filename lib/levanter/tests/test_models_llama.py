"""The Llama model: shapes, masking, scan/remat equivalence, mixed precision, sizes, loss."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.models import ConfigError, LlamaConfig, LmOutput, next_token_loss
from levanter.models.loss import fused_next_token_loss

VOCAB = 64
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64)


@pytest.fixture(scope="module")
def model():
    return TINY.build(VOCAB, key=jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, VOCAB, dtype=jnp.int32)


@jax.jit
def _forward(model, tokens, segment_ids=None):
    return model.forward(tokens, segment_ids=segment_ids)


def test_forward_returns_logits_and_zero_aux_loss(model, tokens):
    out = _forward(model, tokens)
    assert isinstance(out, LmOutput)
    assert out.logits.shape == (2, 12, VOCAB) and out.logits.dtype == jnp.float32
    assert float(out.aux_loss) == 0.0
    np.testing.assert_allclose(model(tokens), out.logits, atol=1e-5)
    assert model.vocab_size == VOCAB and model.config is TINY


def test_attention_is_causal(model, tokens):
    changed = tokens.at[:, 7].set((tokens[:, 7] + 1) % VOCAB)
    before, after = _forward(model, tokens).logits, _forward(model, changed).logits
    np.testing.assert_allclose(before[:, :7], after[:, :7], atol=1e-6)
    assert not np.allclose(before[:, 7:], after[:, 7:], atol=1e-4)


def test_segments_do_not_see_each_other(model, tokens):
    # RoPE makes attention depend only on relative positions, so a document packed after another
    # with segment masking must give exactly the logits it gets on its own.
    segment_ids = jnp.array([[0] * 5 + [1] * 7] * 2, jnp.int32)
    packed = _forward(model, tokens, segment_ids).logits
    alone = _forward(model, tokens[:, 5:]).logits
    np.testing.assert_allclose(packed[:, 5:], alone, atol=1e-5)
    unmasked = _forward(model, tokens).logits
    assert not np.allclose(unmasked[:, 5:], alone, atol=1e-4)


@pytest.mark.parametrize("tied", [False, True])
def test_num_parameters_counts_every_array(tied):
    config = dataclasses.replace(TINY, tie_word_embeddings=tied, num_kv_heads=1)
    model = config.build(VOCAB, key=jax.random.PRNGKey(0))
    assert sum(x.size for x in jax.tree.leaves(model)) == config.num_parameters(VOCAB)
    assert (model.lm_head is None) == tied


def test_flops_per_token_follows_the_documented_formula():
    per_layer_matmuls = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64
    expected = 6 * (2 * per_layer_matmuls + VOCAB * 32) + 12 * 2 * 4 * 8 * 128
    assert TINY.flops_per_token(VOCAB, 128) == expected


def test_bf16_parameters_compute_in_bf16_and_stay_close(model, tokens):
    half = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model)
    logits = _forward(half, tokens).logits
    assert logits.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(logits, np.float32), _forward(model, tokens).logits, atol=5e-2)


def test_config_is_json_serialisable_and_validated():
    assert LlamaConfig(**json.loads(json.dumps(dataclasses.asdict(TINY)))) == TINY
    with pytest.raises(ConfigError, match="num_kv_heads"):
        LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=4, num_kv_heads=3)
    with pytest.raises(ConfigError, match="max_seq_len"):
        TINY.build(VOCAB, key=jax.random.PRNGKey(0))(jnp.zeros((1, 65), jnp.int32))


def test_next_token_loss_matches_a_direct_computation():
    logits = jax.random.normal(jax.random.PRNGKey(3), (2, 5, 7)) * 3
    tokens = jnp.array([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]], jnp.int32)
    mask = jnp.array([[1, 1, 0, 1, 0], [0, 1, 1, 1, 0]], jnp.float32)
    sums = next_token_loss(logits.astype(jnp.bfloat16), tokens, mask, z_loss_weight=1e-2)
    logits32 = np.asarray(logits.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    lse = np.log(np.exp(logits32).sum(-1))
    target_logp = np.take_along_axis(logits32[:, :-1], np.asarray(tokens)[:, 1:, None], -1)[..., 0] - lse[:, :-1]
    expected = -(np.asarray(mask)[:, :-1] * target_logp).sum()
    z = (np.asarray(mask)[:, :-1] * lse[:, :-1] ** 2).sum()
    assert float(sums.weight_sum) == 6.0
    assert float(sums.loss_sum) == pytest.approx(expected, rel=1e-5)
    assert float(sums.z_loss_sum) == pytest.approx(1e-2 * z, rel=1e-5)
    # The last column has no target in the window: it is excluded even if the mask says otherwise.
    assert float(next_token_loss(logits, tokens, jnp.ones((2, 5))).weight_sum) == 8.0


def test_scan_checkpointing_and_fused_loss_give_the_same_loss_and_gradients(model, tokens):
    # One gradient compile per side keeps this cheap: the plain model with the plain loss against
    # the scanned, rematerialised model with the blocked loss.
    variant = dataclasses.replace(TINY, use_scan=True, remat="full")
    scanned = variant.build(VOCAB, key=jax.random.PRNGKey(0))
    np.testing.assert_allclose(_forward(scanned, tokens).logits, _forward(model, tokens).logits, atol=1e-5)
    mask = jnp.ones(tokens.shape, jnp.float32).at[0, 3:6].set(0.0)

    def plain(m):
        return next_token_loss(m(tokens), tokens, mask, z_loss_weight=1e-3)

    def fused(m):
        hidden, _ = m.hidden_states(tokens)
        # Blocks of at most 2 positions a row (5 tokens over 2 rows): 6 blocks of the 12 positions.
        return fused_next_token_loss(hidden, m.unembedding(), tokens, mask, z_loss_weight=1e-3, block_size=5)

    def objective(loss_fn):
        def mean_loss(m):
            sums = loss_fn(m)
            return (sums.loss_sum + sums.z_loss_sum) / sums.weight_sum, sums

        return mean_loss

    (_, expected), g_plain = jax.jit(jax.value_and_grad(objective(plain), has_aux=True))(model)
    (_, got), g_fused = jax.jit(jax.value_and_grad(objective(fused), has_aux=True))(scanned)
    for a, b in zip(expected, got):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    np.testing.assert_allclose(g_fused.layers.inner.mlp.up_proj.weight[1], g_plain.layers[1].mlp.up_proj.weight, atol=1e-6)
    np.testing.assert_allclose(g_fused.layers.inner.attention.q_proj.weight[0], g_plain.layers[0].attention.q_proj.weight, atol=1e-6)
    np.testing.assert_allclose(g_fused.embed.weight, g_plain.embed.weight, atol=1e-6)
    np.testing.assert_allclose(g_fused.lm_head.weight, g_plain.lm_head.weight, atol=1e-6)
