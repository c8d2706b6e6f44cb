"""DPO: the loss against a numpy reference, log(2) at step 0, one reference forward per batch, and a
tiny model that learns a preference rule well enough to rank held-out pairs."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from levanter.data.batch import Batch
from levanter.data.pairs import PairTooLongError, pair_row
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import Trainer, TrainerConfig, TrainState
from levanter.trainer import dpo as dpo_module
from levanter.trainer.data_feed import to_device
from levanter.trainer.dpo import DpoObjective
from levanter.trainer.state import FrozenArrays
from levanter.trainer.step import build_step_functions
from levanter.trainer.tracker import read_metrics

VOCAB = 24
SEQ = 12
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


def tiny_model(key):
    return TINY.build(VOCAB, key=key)


# A preference rule: after a prompt of four tokens from [4, 20), the chosen reply is two even tokens,
# the rejected one two odd tokens (both drawn at random, each followed by the end token 2).
def synthetic_pairs(count: int, seed: int) -> list[tuple[list[int], list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        prompt = [1] + [int(t) for t in rng.integers(4, 20, size=4)]
        chosen = [int(t) for t in rng.choice(np.arange(4, 20, 2), size=2)]
        rejected = [int(t) for t in rng.choice(np.arange(5, 20, 2), size=2)]
        pairs.append((prompt, chosen + [2], rejected + [2]))
    return pairs


def pair_batch(pairs) -> Batch:
    tokens, masks = [], []
    for prompt, chosen, rejected in pairs:
        for reply in (chosen, rejected):
            ids = np.asarray(prompt + reply, np.int64)
            mask = np.asarray([0] * len(prompt) + [1] * len(reply), np.uint8)
            row, row_mask = pair_row(ids, mask, SEQ, "test pair")
            tokens.append(row)
            masks.append(row_mask)
    return Batch(tokens=np.stack(tokens), loss_mask=np.stack(masks))


class PairSource:
    def __init__(self, pairs, batch_pairs):
        self.pairs, self.batch_pairs = pairs, batch_pairs

    def iter_from(self, step):
        while True:
            start = (step * self.batch_pairs) % len(self.pairs)
            yield pair_batch([self.pairs[(start + i) % len(self.pairs)] for i in range(self.batch_pairs)])
            step += 1


def _numpy_row_logprobs(logits: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    out = np.zeros(tokens.shape[0])
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1] - 1):
            out[b] += mask[b, t] * logp[b, t, tokens[b, t + 1]]
    return out


def test_dpo_loss_equals_a_numpy_reference_on_a_fixed_batch():
    policy = tiny_model(jax.random.PRNGKey(0))
    reference = tiny_model(jax.random.PRNGKey(1))
    batch = pair_batch(synthetic_pairs(3, seed=5))
    device = to_device(batch, None)
    beta = 0.3
    pi = _numpy_row_logprobs(np.asarray(policy.forward(device.tokens).logits), batch.tokens, batch.loss_mask)
    ref = _numpy_row_logprobs(np.asarray(reference.forward(device.tokens).logits), batch.tokens, batch.loss_mask)
    margins = beta * ((pi[0::2] - ref[0::2]) - (pi[1::2] - ref[1::2]))
    expected = np.mean(np.log1p(np.exp(-margins)))

    objective = DpoObjective(beta=beta)
    context = dpo_module.sequence_logprobs(reference, device)
    value, sums = objective.loss(policy, device, context, objective.normaliser(device), 1)
    metrics = objective.metrics(sums, objective.normaliser(device), 1)
    assert float(value) == pytest.approx(expected, rel=1e-5)
    assert float(metrics["rewards/margin"]) == pytest.approx(np.mean(margins), rel=1e-4, abs=1e-6)
    assert float(metrics["accuracy"]) == pytest.approx(np.mean(margins > 0))


def test_the_reference_forward_runs_once_per_batch_before_the_microbatches(monkeypatch):
    rows_seen: list[int] = []
    original = dpo_module.sequence_logprobs

    def counted(model, batch):
        jax.debug.callback(lambda n: rows_seen.append(int(n)), batch.tokens.shape[0])
        return original(model, batch)

    monkeypatch.setattr(dpo_module, "sequence_logprobs", counted)
    params, static = eqx.partition(tiny_model(jax.random.PRNGKey(0)), eqx.is_inexact_array)
    optimizer = AdamConfig(learning_rate=1e-3).build(10)
    steps = build_step_functions(static_model=static, optimizer=optimizer, lr_schedule=lambda s: 1e-3,
                                 compute_dtype=jnp.float32, num_microbatches=2, objective=DpoObjective(beta=0.1))
    state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), key=jax.random.PRNGKey(1),
                       frozen=FrozenArrays(reference=jax.tree.map(jnp.copy, params)))
    batch = to_device(pair_batch(synthetic_pairs(4, seed=0)), None)  # 8 rows: 2 microbatches of 2 pairs
    for _ in range(2):
        state, _ = steps.train_step(state, batch)
    jax.effects_barrier()
    # Per step: the reference over all 8 rows once, the policy over each 4-row microbatch.
    assert sorted(rows_seen) == [4, 4, 4, 4, 8, 8], rows_seen


def test_step_zero_loss_is_log_two_and_a_tiny_policy_learns_the_preference(tmp_path):
    train_pairs = synthetic_pairs(128, seed=0)
    held_out = synthetic_pairs(64, seed=1)
    trainer = Trainer(
        TrainerConfig(num_train_steps=30, batch_size=16, microbatch_size=8, log_every=100),
        AdamConfig(learning_rate=3e-3, warmup=0.0),
        output_dir=str(tmp_path / "run"),
        keep_reference=True,
        objective=DpoObjective(beta=0.1),
        asynchronous_checkpoints=False,
    )
    result = trainer.train(tiny_model, PairSource(train_pairs, batch_pairs=8))
    lines = [r for r in read_metrics(trainer.metrics_path) if "dpo_loss" in r]
    # The policy starts as the reference: every margin is 0 and the loss is log 2.
    assert lines[0]["dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert lines[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert {"rewards/chosen", "rewards/rejected", "accuracy"} <= set(lines[0])
    assert np.mean([r["dpo_loss"] for r in lines[-5:]]) < 0.75 * math.log(2)

    # Held-out pairs: the implicit reward (policy minus the frozen reference) prefers the chosen reply.
    device = to_device(pair_batch(held_out), None)
    policy = result.model
    reference = eqx.combine(result.state.frozen.reference, eqx.partition(policy, eqx.is_inexact_array)[1])
    margin = dpo_module.dpo_terms(dpo_module.sequence_logprobs(policy, device),
                                  dpo_module.sequence_logprobs(reference, device), 0.1)
    accuracy = float(jnp.mean(margin[1] > margin[2]))
    print(f"held-out preference accuracy {accuracy:.3f}")
    assert accuracy > 0.9


def test_a_pair_whose_reply_cannot_fit_is_refused_and_a_long_prompt_loses_its_start():
    ids = np.arange(1, 11)
    mask = np.asarray([0] * 7 + [1] * 3, np.uint8)
    tokens, loss_mask = pair_row(ids, mask, 6, "pair 3 (chosen)")
    assert tokens.tolist() == [5, 6, 7, 8, 9, 10]  # four prompt tokens cut from the left
    assert loss_mask.tolist() == [0, 0, 1, 1, 1, 0]
    with pytest.raises(PairTooLongError, match="pair 3"):
        pair_row(ids, mask, 3, "pair 3 (chosen)")
