"""AdamW's options and the schedules comparisons turn on: update clipping by RMS (per stacked copy)
and by global norm, Nesterov momentum against torch's NAdam, the weight-decay mask by role and by
path for every optimizer, schedules in cycles value by value, and records that stay as they were
while the new options are left at their defaults."""

from __future__ import annotations

import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from haliax.axes import Axes
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig, LionConfig, MuonConfig, OptimizerConfig, OptimizerConfigError, ScheduleError
from levanter.optim.weight_decay import parameter_paths
from levanter.trainer import TrainerConfig


def first_update(config, grads, params=None, param_axes=None):
    params = jax.tree.map(jnp.ones_like, grads) if params is None else params
    tx = config.build(10, param_axes=param_axes)
    updates, _ = tx.update(grads, tx.init(params), params)
    return updates


# --- update clipping -------------------------------------------------------------------------------

# With beta1 = beta2 = 0 Adam's first step is g / (|g| + eps): +-1 where the gradient is non-zero
# (to 1e-8 relative), 0 where it is zero; lr = 1 and no decay leave it as the update, negated.
SIGN_ADAM = dict(learning_rate=1.0, lr_schedule="constant", max_grad_norm=None, beta1=0.0, beta2=0.0)


def test_update_rms_clipping_bounds_each_stacked_copy_on_its_own():
    grads = np.zeros((2, 4, 4), np.float32)
    grads[0] = 3.0  # layer 0: every entry +-1 after Adam, RMS 1
    grads[1, 0, 0] = -5.0  # layer 1: one entry of 16, RMS 1/4
    grads = {"w": jnp.asarray(grads)}
    axes = {"w": Axes(("layers", "embed", "mlp"))}
    update = np.asarray(first_update(AdamConfig(**SIGN_ADAM, update_rms_clip=0.5), grads, param_axes=axes)["w"])
    np.testing.assert_allclose(update[0], -0.5, rtol=1e-6)  # scaled to RMS 0.5
    np.testing.assert_allclose(update[1, 0, 0], 1.0, rtol=1e-6)  # under the bound: untouched
    assert np.count_nonzero(update[1]) == 1
    unclipped = np.asarray(first_update(AdamConfig(**SIGN_ADAM), grads, param_axes=axes)["w"])
    np.testing.assert_allclose(unclipped[0], -1.0, rtol=1e-6)


def test_update_rms_clipping_of_an_unstacked_parameter_is_optaxs_block_rms_clipping():
    grads = {"w": jnp.asarray(np.random.RandomState(0).normal(size=(3, 5)), jnp.float32), "b": jnp.asarray([0.0, 2.0])}
    ours = first_update(AdamConfig(**SIGN_ADAM, update_rms_clip=0.3), grads)
    adam = first_update(AdamConfig(**SIGN_ADAM), grads)
    theirs, _ = optax.clip_by_block_rms(0.3).update(adam, optax.EmptyState())
    for name in grads:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-6)


def test_update_norm_clipping_bounds_the_whole_step():
    grads = {"w": jnp.full((4, 4), 2.0), "b": jnp.full((9,), -1.0)}  # 25 entries of +-1: norm 5
    ours = first_update(AdamConfig(**SIGN_ADAM, update_norm_clip=2.0), grads)
    np.testing.assert_allclose(ours["w"], -2.0 / 5, rtol=1e-6)
    np.testing.assert_allclose(ours["b"], 2.0 / 5, rtol=1e-6)


@pytest.mark.parametrize("field", ["update_rms_clip", "update_norm_clip"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_update_clip_bounds_must_be_positive(field, value):
    with pytest.raises(OptimizerConfigError, match=field):
        AdamConfig(1e-3, **{field: value})


# --- Nesterov ----------------------------------------------------------------------------------------

STEPS = 10


def test_nesterov_adamw_matches_torch_nadam():
    """Reference: ``torch.optim.NAdam`` (torch 2.13) with ``decoupled_weight_decay=True``. Its
    momentum schedule ``mu_t = beta1 (1 - 0.5 * 0.96**(t * momentum_decay))`` is Dozat's; with
    ``momentum_decay`` so large that ``0.96**(...)`` underflows to 0, ``mu_t = beta1`` for every step
    and its update is exactly ``b1 m_t / (1 - b1^(t+1)) + (1 - b1) g_t / (1 - b1^t)`` over
    ``sqrt(v_t / (1 - b2^t)) + eps``, optax's ``nesterov=True``; decay ``p (1 - lr wd)`` as ours.

    Tolerance: |p| < 2 throughout, so each side rounds p by at most 2**-23 per step, and the update
    (|u| < 4, times lr = 0.01) differs by a few ulps of 4 * 0.01: STEPS * 2**-21 covers both.
    """
    torch = pytest.importorskip("torch")
    rng = np.random.RandomState(0)
    init = {"w": rng.normal(size=(4, 3)).astype(np.float32), "v": rng.normal(size=(3,)).astype(np.float32)}
    targets = [rng.normal(size=(4,)).astype(np.float32) for _ in range(STEPS)]
    loss = lambda p, y: jnp.sum((jnp.tanh(p["w"] @ p["v"]) - y) ** 2)  # noqa: E731
    grad = jax.jit(jax.grad(loss))

    config = AdamConfig(1e-2, 0.1, lr_schedule="constant", max_grad_norm=None, beta1=0.9, beta2=0.99, nesterov=True,
                        weight_decay_exclude=())  # torch decays both
    tx = config.build(STEPS)
    params = jax.tree.map(jnp.asarray, init)
    state = tx.init(params)
    tensors = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}
    reference = torch.optim.NAdam(list(tensors.values()), lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1,
                                  momentum_decay=1e9, decoupled_weight_decay=True)
    plain = AdamConfig(1e-2, 0.1, lr_schedule="constant", max_grad_norm=None, beta1=0.9, beta2=0.99, weight_decay_exclude=())
    plain_params, plain_state, plain_tx = params, plain.build(STEPS).init(params), plain.build(STEPS)
    for y in targets:
        g = grad(params, y)
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        for k, t in tensors.items():
            t.grad = torch.tensor(np.asarray(grad({n: jnp.asarray(s.detach().numpy()) for n, s in tensors.items()}, y)[k]))
        reference.step()
        plain_updates, plain_state = plain_tx.update(grad(plain_params, y), plain_state, plain_params)
        plain_params = optax.apply_updates(plain_params, plain_updates)
        for k, t in tensors.items():
            np.testing.assert_allclose(np.asarray(params[k]), t.detach().numpy(), rtol=0, atol=STEPS * 2.0**-21)
    assert max(float(np.max(np.abs(params[k] - plain_params[k]))) for k in init) > 100 * STEPS * 2.0**-21


# --- weight decay by role and path -------------------------------------------------------------------

TINY_AXES = {
    "embed": Axes(("vocab", "embed")),
    "q_proj": Axes(("layers", "embed", "heads", "head_dim")),
    "q_bias": Axes(("layers", "heads", "head_dim")),
    "norm": Axes(("layers", "embed")),
    "up": Axes(("embed", "mlp")),
    "lm_head": Axes(("embed", "vocab")),
}
TINY_SHAPES = {"embed": (5, 4), "q_proj": (2, 4, 2, 2), "q_bias": (2, 2, 2), "norm": (2, 4), "up": (4, 3), "lm_head": (4, 5)}


def decayed(config) -> dict[str, bool]:
    """Which parameters ``config`` decays, seen in its update for a zero gradient (weight decay only)."""
    params = {k: jnp.ones(s) for k, s in TINY_SHAPES.items()}
    updates = first_update(config, jax.tree.map(jnp.zeros_like, params), params=params, param_axes=TINY_AXES)
    return {k: bool(np.any(np.asarray(u) != 0)) for k, u in updates.items()}


@pytest.mark.parametrize(
    "config",
    [AdamConfig(0.1, 0.5), LionConfig(0.1, 0.5), MuonConfig(0.1, 0.5)],
    ids=["adam", "lion", "muon"],
)
def test_by_default_only_hidden_matrices_are_decayed(config):
    assert decayed(config) == {"embed": False, "q_proj": True, "q_bias": False, "norm": False, "up": True, "lm_head": False}


def test_decay_can_be_chosen_by_role_and_by_path():
    old_rule = AdamConfig(0.1, 0.5, weight_decay_exclude=("vector",))
    assert decayed(old_rule) == {"embed": True, "q_proj": True, "q_bias": False, "norm": False, "up": True, "lm_head": True}
    by_path = AdamConfig(0.1, 0.5, weight_decay_exclude=("vector", "embedding", "q_*"), weight_decay_include=("lm_head*",))
    assert decayed(by_path) == {"embed": False, "q_proj": False, "q_bias": False, "norm": False, "up": True, "lm_head": True}


def test_the_trainers_mask_reads_the_model_paths_and_axes():
    from haliax.module import logical_axes

    model = LlamaConfig(hidden_dim=8, intermediate_dim=16, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=8,
                        qkv_bias=True, use_scan=True).build(16, key=jax.random.PRNGKey(0))
    params = eqx.filter(model, eqx.is_inexact_array)
    config = AdamConfig(1e-3, 0.1, weight_decay_exclude=("vector", "embedding", "head", "*.mlp.down_proj.*"))
    mask = dict(zip(jax.tree.leaves(parameter_paths(params)), jax.tree.leaves(config.weight_decay_mask(params, logical_axes(params)))))
    decays = sorted(path for path, on in mask.items() if on)
    assert decays == [f"layers.inner.{name}.weight" for name in
                      ("attention.k_proj", "attention.o_proj", "attention.q_proj", "attention.v_proj", "mlp.gate_proj", "mlp.up_proj")]
    assert {"embed.weight", "lm_head.weight", "final_norm.weight", "layers.inner.attention.q_bias.weight"} <= set(mask)


@pytest.mark.parametrize("entry", ["bias", "norm", "", "Vector"])
def test_a_bare_word_that_is_no_role_is_refused(entry):
    with pytest.raises(OptimizerConfigError, match="weight_decay_exclude"):
        AdamConfig(1e-3, 0.1, weight_decay_exclude=("vector", entry))


# --- schedules in cycles ------------------------------------------------------------------------------


def rates(config, steps):
    return np.asarray(config.lr_scheduler(steps)(np.arange(steps)), np.float64)


def test_cosine_with_restarts_repeats_warmup_and_cosine_each_cycle():
    got = rates(AdamConfig(1.0, warmup=2, lr_schedule="cosine", cycles=2), 20)
    expected = []
    for step in range(20):
        t = step % 10  # two cycles of 10 steps: warm-up 2, cosine over the other 8
        expected.append((t + 1) / 2 if t < 2 else 0.5 * (1 + math.cos(math.pi * (t - 2) / 8)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_wsd_cycles_at_given_steps_warm_up_again():
    config = AdamConfig(1.0, warmup=2, decay=0.5, lr_schedule="wsd", restarts=(6,), rewarmup=3, min_lr_ratio=0.1)
    got = rates(config, 16)

    def wsd(t, length, warm):
        decay_steps = round(0.5 * length)  # a share of the cycle
        if t < warm:
            return (t + 1) / warm
        progress = min(max((t - (length - decay_steps)) / decay_steps, 0.0), 1.0)
        return 1.0 + (0.1 - 1.0) * progress

    expected = [wsd(s, 6, 2) for s in range(6)] + [wsd(s - 6, 10, 3) for s in range(6, 16)]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert got[3] > got[4] > got[5] and got[6] < got[7] < got[8] == pytest.approx(1.0)  # decayed, then warmed up again


def test_restarts_as_fractions_and_a_hard_restart():
    got = rates(AdamConfig(1.0, lr_schedule="linear", restarts=(0.5,), rewarmup=0), 8)
    np.testing.assert_allclose(got, [1.0, 0.75, 0.5, 0.25] * 2, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(cycles=0), "cycles"),
        (dict(cycles=1.5), "cycles"),
        (dict(restarts=(5, 3)), "restarts"),
        (dict(restarts=(0,)), "restarts"),
        (dict(restarts=(2.5,)), "restarts"),
        (dict(restarts=(math.nan,)), "restarts"),
        (dict(restarts=(5,), cycles=2), "restarts"),
        (dict(rewarmup=-1), "rewarmup"),
    ],
)
def test_bad_cycle_settings_are_refused_when_the_config_is_made(kwargs, named):
    with pytest.raises(ScheduleError, match=named):
        AdamConfig(1e-3, **kwargs)


@pytest.mark.parametrize(
    "kwargs, named",
    [(dict(restarts=(150,)), "restarts"), (dict(cycles=200), "cycles"), (dict(restarts=(90,), rewarmup=20), "rewarmup")],
)
def test_cycles_that_do_not_fit_the_run_are_refused_when_it_is_known(kwargs, named):
    with pytest.raises(ScheduleError, match=named):
        AdamConfig(1e-3, **kwargs).lr_scheduler(100)


# --- records ------------------------------------------------------------------------------------------

ADAM_RECORD = {"type", "learning_rate", "weight_decay", "max_grad_norm", "warmup", "decay", "min_lr_ratio", "lr_schedule",
               "beta1", "beta2", "epsilon"}


def test_new_options_at_their_defaults_leave_the_records_as_they_were():
    assert set(AdamConfig(1e-3, 0.1).to_dict()) == ADAM_RECORD
    assert set(TrainerConfig(num_train_steps=10, batch_size=2).hashed_settings()) == {
        "num_train_steps", "batch_size", "microbatch_size", "z_loss_weight", "compute_dtype", "seed"}


def test_new_options_are_recorded_and_read_back_when_set():
    config = AdamConfig(1e-3, 0.1, nesterov=True, update_rms_clip=1.0, update_norm_clip=2.0, restarts=(10, 20), rewarmup=5,
                        weight_decay_exclude=("vector", "*.lm_head.*"), weight_decay_include=("embedding",),
                        moment_dtype="bfloat16")
    record = json.loads(json.dumps(config.to_dict()))
    assert set(record) - ADAM_RECORD == {"nesterov", "update_rms_clip", "update_norm_clip", "restarts", "rewarmup",
                                        "weight_decay_exclude", "weight_decay_include", "moment_dtype"}
    assert OptimizerConfig.from_dict(record) == config
    trainer = TrainerConfig(num_train_steps=10, batch_size=2, skip_bad_steps=True, skip_loss_spike_factor=2.0, ema_decay=0.99)
    assert {"skip_bad_steps", "skip_loss_spike_factor", "ema_decay"} <= set(trainer.hashed_settings())
    assert TrainerConfig.from_dict(json.loads(json.dumps(trainer.to_dict()))) == trainer
