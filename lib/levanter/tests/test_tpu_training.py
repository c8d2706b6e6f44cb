"""On a TPU chip: the output layer's loss and a whole training run, as they run there.

- The blocked cross-entropy a TPU step uses (by token blocks and by vocabulary blocks) equals the
  plain loss computed in float32 at the highest precision on the CPU, in value and gradients, to the
  rounding of the matmul precision in force (``haliax.numerics.matmul_rounding``).
- A small Llama with scanned layers, splash attention and bfloat16 compute trains through the real
  :class:`~levanter.trainer.Trainer` without rematerialisation and under the two policies a TPU run
  uses ("full" and "save_attention", which keeps the splash kernel's residuals; every policy is
  compiled for TPUs in ``test_compile_for_tpu.py``): its loss falls, every step's loss is finite,
  and the policies agree on the first step's loss (they compute the same function).
- The same Llama trains with its optimizer state in the host's memory between steps (as the run that
  keeps it on the chip does) and with Adam's moments stored in bfloat16 as well: how llama_1_4b fits
  one v5e chip.

``make test-tpu`` runs this file at the default matmul precision and again under "highest".
Skipped off a TPU.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax.numerics import matmul_rounding
from levanter.models.llama import LlamaConfig
from levanter.models.loss import fused_next_token_loss, next_token_loss
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, Trainer, TrainerConfig
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.tracker import read_metrics

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU chip (make test-tpu runs it on one)"),
]

ROWS, SEQ, HIDDEN, VOCAB = 4, 512, 256, 8192


def loss_inputs(dtype):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    hidden = jax.random.normal(keys[0], (ROWS, SEQ, HIDDEN), dtype)
    w = (HIDDEN**-0.5 * jax.random.normal(keys[1], (HIDDEN, VOCAB))).astype(dtype)
    tokens = jax.random.randint(keys[2], (ROWS, SEQ), 0, VOCAB, jnp.int32)
    mask = (jnp.arange(SEQ) % 7 != 0).astype(jnp.float32)[None].repeat(ROWS, 0)
    return hidden, w, tokens, mask


def mean_loss(sums):
    return (sums.loss_sum + sums.z_loss_sum) / sums.weight_sum


def value_and_grads(loss_of, hidden, w):
    return jax.jit(jax.value_and_grad(loss_of, argnums=(0, 1)))(hidden, w)


def reference(hidden, w, tokens, mask):
    """The plain loss from float32 logits at the highest precision, on the CPU."""
    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(np.asarray(x, np.float32 if x.dtype != jnp.int32 else np.int32), cpu) for x in (hidden, w, tokens, mask)]
    with jax.default_device(cpu), jax.default_matmul_precision("highest"):
        def loss_of(h, w):
            return mean_loss(next_token_loss(h @ w, args[2], args[3], z_loss_weight=1e-3))

        return jax.jit(jax.value_and_grad(loss_of, argnums=(0, 1)))(args[0], args[1])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("blocks", [{"block_size": 512}, {"vocab_block": 1024}], ids=["token_blocks", "vocab_blocks"])
def test_blocked_loss_on_a_tpu_equals_the_plain_float32_loss(dtype, blocks):
    hidden, w, tokens, mask = loss_inputs(dtype)
    got_value, got_grads = value_and_grads(
        lambda h, w: mean_loss(fused_next_token_loss(h, w, tokens, mask, z_loss_weight=1e-3, **blocks)), hidden, w)
    want_value, want_grads = reference(hidden, w, tokens, mask)
    # Logits are HIDDEN-term products of operands rounded as the precision says (and, in bfloat16,
    # the logit gradients are rounded to bfloat16 before the two backward products).
    unit = max(matmul_rounding(dtype), matmul_rounding(jnp.float32))
    # Relative to the results' scale: operand rounding through HIDDEN-term products (random walk),
    # plus float32 accumulation of the gradients over the vocabulary or the tokens.
    accumulation = 8 * float(jnp.finfo(jnp.float32).eps) * math.sqrt(VOCAB + ROWS * SEQ)
    logit_error = 4 * unit * math.sqrt(HIDDEN) + accumulation
    assert float(got_value) == pytest.approx(float(want_value), rel=logit_error)
    for label, got, want in zip(("d hidden", "d unembedding"), got_grads, want_grads):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert np.isfinite(got).all(), label
        np.testing.assert_allclose(got, want, atol=4 * logit_error * np.abs(want).max(), rtol=0, err_msg=label)


TINY = LlamaConfig(hidden_dim=256, intermediate_dim=512, num_layers=2, num_heads=2, num_kv_heads=1, max_seq_len=SEQ, use_scan=True)
TRAIN_VOCAB = 512
CHIP_POLICIES = ("none", "full", "save_attention")  # each one of levanter.models.transformer.REMAT_POLICIES
STEPS = 10


def pattern_source():
    # A learnable stream (a repeating ramp): a few steps lower the loss visibly.
    return InMemoryWindows(np.tile(np.arange(TRAIN_VOCAB), 64), seq_len=SEQ, batch_size=8)


# Beyond the policies, the memory levers a big model needs on one chip: the optimizer state kept in the
# host's memory between steps (pinned host memory, moved in for the update), alone and with Adam's
# moments stored in bfloat16.
LEVERS = {"full, offloaded": dict(offload=True), "full, offloaded, bf16 moments": dict(offload=True, moments="bfloat16")}


def train(tmp_path_factory, remat, offload=False, moments="float32"):
    config = dataclasses.replace(TINY, remat=remat)
    out = tmp_path_factory.mktemp("run")
    trainer = Trainer(
        TrainerConfig(num_train_steps=STEPS, batch_size=8, log_every=4, checkpoint_at_end=False, mesh=MeshConfig(data=-1),
                      offload_optimizer_state=offload),
        AdamConfig(3e-3, 0.1, warmup=2, moment_dtype=moments), output_dir=str(out),
    )
    result = trainer.train(lambda key: config.build(TRAIN_VOCAB, key=key), pattern_source())
    return [row["loss"] for row in read_metrics(result.metrics_path) if "loss" in row]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One short run per remat policy and per memory lever: (label -> per-step losses)."""
    losses = {remat: train(tmp_path_factory, remat) for remat in CHIP_POLICIES}
    losses.update({label: train(tmp_path_factory, "full", **lever) for label, lever in LEVERS.items()})
    return losses


def test_a_small_llama_trains_on_a_tpu_under_every_remat_policy_and_memory_lever(runs):
    for label, losses in runs.items():
        assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), label
        assert losses[-1] < losses[0] - 1.0, (label, losses)


def test_remat_policies_compute_the_same_first_step(runs):
    """Remat changes what is stored, not what is computed: the first step's loss (before any update)
    is the same function of the same weights and batch, up to bfloat16 rounding of the compute."""
    first = {remat: runs[remat][0] for remat in CHIP_POLICIES}
    reference_loss = first["none"]
    for remat, loss in first.items():
        assert loss == pytest.approx(reference_loss, rel=8 * matmul_rounding(jnp.bfloat16)), first


def test_offloaded_optimizer_state_trains_as_the_state_kept_on_the_chip(runs):
    """Where the state waits between steps changes nothing the update computes: the same float32
    moments come back from the host, so every step's loss matches the run that kept them on the chip
    (to the bfloat16 rounding of the compute, should the two programs fuse differently)."""
    offloaded, kept = runs["full, offloaded"], runs["full"]
    assert offloaded == pytest.approx(kept, rel=8 * matmul_rounding(jnp.bfloat16)), (offloaded, kept)
