"""The train step never holds a large vocabulary's [B, T, V] logits: past a size it computes the
cross-entropy a block of positions at a time (forward and backward), on one device or a mesh, with
the loss and gradients of the plain loss."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from haliax.partitioning import make_mesh
from levanter.models.llama import LlamaConfig
from levanter.models.loss import fused_next_token_loss, next_token_loss, position_blocks
from levanter.trainer.state import TrainState
from levanter.trainer.step import FUSED_LOSS_MIN_BYTES, DeviceBatch, build_step_functions, prefers_fused_loss

MIB = 2**20


def _abstract(config: LlamaConfig, vocab: int):
    return jax.eval_shape(lambda: config.build(vocab, key=jax.random.PRNGKey(0)))


def test_large_logits_take_the_blocked_loss_whatever_the_hidden_size():
    # The shape of the issue: a 1.4B Llama (hidden 2048) with Llama 3's vocabulary at 8 x 2048 tokens,
    # whose float32 logits alone would take 8 GiB.
    llama_1_4b = LlamaConfig(hidden_dim=2048, intermediate_dim=7168, num_layers=16, num_heads=16, num_kv_heads=8, max_seq_len=4096)
    model = _abstract(llama_1_4b, 128_256)
    assert prefers_fused_loss(model, num_tokens=8 * 2048, num_devices=1)
    assert prefers_fused_loss(model, num_tokens=8 * 8 * 2048, num_devices=8)  # the same per device
    # Below FUSED_LOSS_MIN_BYTES of float32 logits per device a wide model keeps the plain loss.
    small_batch = FUSED_LOSS_MIN_BYTES // (4 * 128_256) - 1
    assert not prefers_fused_loss(model, num_tokens=small_batch, num_devices=1)
    assert not prefers_fused_loss(model, num_tokens=8 * 2048, num_devices=16)


def _loss_inputs(key, batch: int, seq_len: int, embed: int, vocab: int):
    """Hidden states, an output matrix and tokens for a loss test: normal, scaled 0.3, uniform."""
    keys = jax.random.split(key, 3)
    hidden = jax.random.normal(keys[0], (batch, seq_len, embed), jnp.float32)
    unembedding = 0.3 * jax.random.normal(keys[1], (embed, vocab), jnp.float32)
    tokens = jax.random.randint(keys[2], (batch, seq_len), 0, vocab, dtype=jnp.int32)
    return hidden, unembedding, tokens


def _mean_loss_and_grads(loss_fn):
    """``value_and_grad`` over (hidden, unembedding) of a loss function's ``LossSums``, z-loss included, per weighted token."""

    def mean(h, w):
        sums = loss_fn(h, w)
        return (sums.loss_sum + sums.z_loss_sum) / sums.weight_sum

    return jax.value_and_grad(mean, argnums=(0, 1))


def _sharded(mesh, hidden, unembedding):
    """Rows split over "data", the vocabulary over "model" (haliax's default rules)."""
    return (jax.device_put(hidden, NamedSharding(mesh, P("data"))),
            jax.device_put(unembedding, NamedSharding(mesh, P(None, "model"))))


def _assert_same_loss_and_grads(got, expected, *, atol: float) -> None:
    """``(loss, (d hidden, d unembedding))`` pairs, equal to float32 reordering (1e-5 relative)."""
    (value, grads), (expected_value, expected_grads) = got, expected
    np.testing.assert_allclose(value, expected_value, rtol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=atol)


def _step_temp_bytes(config: LlamaConfig, vocab: int, batch: int, seq_len: int, fused_loss) -> int:
    """Scratch memory XLA plans for one bfloat16 train step (compiled, never run)."""
    model = _abstract(config, vocab)
    is_param = lambda x: isinstance(x, jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact)
    params, static = eqx.partition(model, is_param)
    optimizer = optax.sgd(1e-3)
    state = TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=jax.eval_shape(optimizer.init, params),
        key=jax.ShapeDtypeStruct((2,), jnp.uint32),
    )
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    device_batch = DeviceBatch(tokens=tokens, loss_mask=jax.ShapeDtypeStruct((batch, seq_len), jnp.float32), segment_ids=None)
    steps = build_step_functions(
        static_model=static, optimizer=optimizer, lr_schedule=lambda step: 1e-3, compute_dtype=jnp.bfloat16,
        z_loss_weight=1e-4, num_microbatches=1, fused_loss=fused_loss,
    )
    return int(steps.train_step.lower(state, device_batch).compile().memory_analysis().temp_size_in_bytes)


def test_the_loss_of_a_train_step_takes_a_fraction_of_the_logits_it_would_have_materialised():
    # A 32k vocabulary at 64 x 128 tokens: 1 GiB of float32 logits, the size where the rule
    # switches to the blocked loss. The same model with a 512-token vocabulary, whose logits are
    # negligible, gives the memory of everything but the loss. (Short rows: the rule counts tokens,
    # and attention over short rows compiles in a fraction of the time long ones take.)
    config = LlamaConfig(hidden_dim=256, intermediate_dim=512, num_layers=2, num_heads=4, num_kv_heads=4, max_seq_len=128)
    vocab, batch, seq_len = 32_768, 64, 128
    logits_f32 = 4 * batch * seq_len * vocab
    rest = _step_temp_bytes(config, 512, batch, seq_len, fused_loss=False)
    plain = _step_temp_bytes(config, vocab, batch, seq_len, fused_loss=False) - rest
    automatic = _step_temp_bytes(config, vocab, batch, seq_len, fused_loss=None) - rest
    print(f"scratch memory of the loss: plain {plain / MIB:.0f} MiB, automatic {automatic / MIB:.0f} MiB "
          f"(float32 logits {logits_f32 / MIB:.0f} MiB, the rest of the step {rest / MIB:.0f} MiB)")
    assert plain > 2 * logits_f32  # float32 logits and their gradient, bfloat16 copies of both
    # Blocks of logits, the output matrix's gradient and the vocabulary-sized parameters' copies.
    assert automatic < logits_f32 / 4


def test_the_loss_blocks_split_the_sequence_evenly_where_they_can_and_pad_only_where_they_cannot():
    # (seq_len, most positions a block) -> (blocks, positions a block)
    assert position_blocks(4096, 2092) == (2, 2048)  # the 8B on a v5e-256: not 2 x 2,092, padded
    assert position_blocks(2048, 261) == (8, 256)  # llama_600m at batch 8 on one chip
    assert position_blocks(4096, 1500) == (4, 1024)  # 3 blocks would not split 4,096 evenly
    assert position_blocks(128, 1032) == (1, 128)  # a short sequence is one block
    assert position_blocks(41, 7) == (6, 7)  # a prime: 6 blocks of 7, the last padded by 1
    assert position_blocks(5, 0) == (5, 1)  # a limit below one position still makes progress


@pytest.mark.isolated  # 8 simulated devices: see conftest.py
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_blocked_loss_on_a_mesh_gives_the_plain_loss_and_gradients_and_spreads_its_blocks():
    # data=4 x model=2: rows split over "data", the vocabulary over "model" (haliax's default rules).
    mesh = make_mesh(data=4, model=2)
    batch, seq_len, embed, vocab = 8, 41, 16, 96
    hidden, unembedding, tokens = _loss_inputs(jax.random.PRNGKey(0), batch, seq_len, embed, vocab)
    mask = jnp.ones((batch, seq_len), jnp.float32).at[1, 5:9].set(0.0)

    def objective(loss_fn):
        return jax.jit(_mean_loss_and_grads(loss_fn))

    plain = objective(lambda h, w: next_token_loss(jnp.dot(h, w), tokens, mask, z_loss_weight=1e-2))
    # At most 7 positions of every row per block: 41 (a prime) splits evenly only into 41 blocks, so
    # it is cut into 6 blocks of 7, the last one padded.
    blocked = objective(lambda h, w: fused_next_token_loss(h, w, tokens, mask, z_loss_weight=1e-2, block_size=7 * batch))
    sharded = _sharded(mesh, hidden, unembedding)
    got = blocked(*sharded)
    # float32 sums over at most 8 x 41 tokens, reordered: far below 1e-5 relative.
    _assert_same_loss_and_grads(got, plain(hidden, unembedding), atol=1e-7)
    dh_got = got[1][0]
    # Each device scores only its own rows: the blocks stay split over "data" (no device holds
    # every row's logits), so per-device scratch memory is well below the single-device figure.
    one_device = blocked.lower(hidden, unembedding).compile().memory_analysis().temp_size_in_bytes
    per_device = blocked.lower(*sharded).compile().memory_analysis().temp_size_in_bytes
    assert dh_got.sharding.spec[0] == "data", dh_got.sharding
    assert per_device < one_device / 2, (per_device, one_device)


@pytest.mark.parametrize("cap", [None, 3.0])
@pytest.mark.parametrize("vocab_block", [1, 40, 96, 500])
def test_the_vocabulary_streamed_loss_gives_the_plain_loss_and_gradients(vocab_block, cap):
    # 96 words in blocks of 40: three blocks, the last one padded with words that score -inf.
    batch, seq_len, embed, vocab = 3, 11, 16, 96
    hidden, unembedding, tokens = _loss_inputs(jax.random.PRNGKey(1), batch, seq_len, embed, vocab)
    mask = jnp.ones((batch, seq_len), jnp.float32).at[1, 2:6].set(0.0)

    def capped(logits):
        return logits if cap is None else cap * jnp.tanh(logits / cap)

    expected = _mean_loss_and_grads(lambda h, w: next_token_loss(capped(jnp.dot(h, w)), tokens, mask, z_loss_weight=1e-2))(
        hidden, unembedding)
    got = _mean_loss_and_grads(lambda h, w: fused_next_token_loss(
        h, w, tokens, mask, z_loss_weight=1e-2, logit_softcap=cap, vocab_block=vocab_block))(hidden, unembedding)
    # float32 sums over 33 tokens and 96 words, in another order: far below 1e-5 relative.
    _assert_same_loss_and_grads(got, expected, atol=1e-7)


@pytest.mark.isolated  # 8 simulated devices: see conftest.py
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_the_vocabulary_streamed_loss_on_a_mesh_keeps_rows_split():
    mesh = make_mesh(data=4, model=2)
    batch, seq_len, embed, vocab = 8, 40, 16, 96
    hidden, unembedding, tokens = _loss_inputs(jax.random.PRNGKey(0), batch, seq_len, embed, vocab)
    mask = jnp.ones((batch, seq_len), jnp.float32)

    def objective(loss_fn):
        return jax.jit(jax.value_and_grad(lambda h, w: loss_fn(h, w).loss_sum, argnums=(0, 1)))

    plain = objective(lambda h, w: next_token_loss(jnp.dot(h, w), tokens, mask))
    streamed = objective(lambda h, w: fused_next_token_loss(h, w, tokens, mask, vocab_block=40))
    got = streamed(*_sharded(mesh, hidden, unembedding))
    # Sums (not means) over 320 tokens: gradients larger than the mean's, so an absolute 1e-6 floor.
    _assert_same_loss_and_grads(got, plain(hidden, unembedding), atol=1e-6)
    dh_got = got[1][0]
    assert dh_got.sharding.spec[0] == "data", dh_got.sharding
