"""Optimizer configs: schedules, weight-decay masking, JSON round trips, a second optimizer."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from haliax.axes import Axes
from levanter.optim import (
    AdamConfig,
    LionConfig,
    OptimizerConfig,
    OptimizerConfigError,
    ScheduleError,
    weight_decay_mask_from_axes,
)


def lrs(config, steps):
    schedule = config.lr_scheduler(steps)
    return np.array([float(schedule(i)) for i in range(steps)])


def test_warmup_then_cosine_reaches_min_lr():
    config = AdamConfig(1.0, warmup=10, min_lr_ratio=0.1, lr_schedule="cosine")
    values = lrs(config, 111)
    np.testing.assert_allclose(values[:10], np.arange(1, 11) / 10, rtol=1e-6)  # no wasted step at 0
    assert np.all(np.diff(values[10:]) <= 1e-7)
    assert values[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 100 / 101)), rel=1e-5)
    assert lrs(config, 1000)[-1] == pytest.approx(0.1, abs=1e-4)


def test_warmup_fraction_and_linear_decay():
    values = lrs(AdamConfig(2.0, warmup=0.1, lr_schedule="linear"), 100)
    assert values[9] == pytest.approx(2.0)
    assert values[10 + 45] == pytest.approx(1.0, rel=1e-2)
    assert values[-1] == pytest.approx(2.0 / 90, rel=1e-3)


def test_constant_and_wsd_shapes():
    assert np.allclose(lrs(AdamConfig(0.5, lr_schedule="constant"), 20), 0.5)
    values = lrs(AdamConfig(1.0, lr_schedule="wsd", warmup=5, decay=0.2, min_lr_ratio=0.0), 100)
    assert np.allclose(values[5:80], 1.0)  # stable until the last 20%
    assert np.all(np.diff(values[80:]) < 0)
    assert values[-1] == pytest.approx(1 / 20, rel=1e-4)


@pytest.mark.parametrize(
    "kwargs",
    [dict(lr_schedule="exponential"), dict(warmup=500), dict(warmup=2.5), dict(min_lr_ratio=2.0), dict(warmup=-1)],
)
def test_bad_schedules_raise(kwargs):
    with pytest.raises(ScheduleError):
        AdamConfig(1e-3, **kwargs).lr_scheduler(100)


def test_configs_round_trip_through_json():
    for config in (AdamConfig(6e-4, 0.1, warmup=0.01, lr_schedule="wsd"), LionConfig(1e-4, 1.0, beta2=0.98)):
        record = json.loads(json.dumps(config.to_dict()))
        assert OptimizerConfig.from_dict(record) == config
    assert set(OptimizerConfig.registered()) >= {"adam", "lion"}
    with pytest.raises(OptimizerConfigError, match="adam"):
        OptimizerConfig.from_dict({"type": "sgdx", "learning_rate": 1.0})


class Tiny(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    stacked_norm: jax.Array  # [layers, embed]: a vector per layer


def _tiny():
    return Tiny(weight=jnp.ones((3, 4)), bias=jnp.ones((4,)), stacked_norm=jnp.ones((2, 4)))


def test_weight_decay_skips_vectors_and_stacked_norms():
    params = _tiny()
    axes = Tiny(weight=Axes(("embed", "mlp")), bias=Axes(("mlp",)), stacked_norm=Axes(("layers", "embed")))
    mask = weight_decay_mask_from_axes(axes, params)
    assert (mask.weight, mask.bias, mask.stacked_norm) == (True, False, False)

    tx = AdamConfig(0.1, weight_decay=1.0, lr_schedule="constant").build(10, weight_decay_mask=mask)
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero_grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(new.weight, 0.9)  # decayed by lr * wd
    np.testing.assert_allclose(new.bias, 1.0)
    np.testing.assert_allclose(new.stacked_norm, 1.0)


def test_default_mask_is_by_rank():
    params = _tiny()
    tx = AdamConfig(0.1, weight_decay=1.0, lr_schedule="constant").build(10)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(new.bias, 1.0)
    np.testing.assert_allclose(new.weight, 0.9)


@pytest.mark.parametrize("config", [AdamConfig(0.1), LionConfig(0.1)])
def test_optimizers_minimise_a_quadratic(config):
    target = jnp.array([1.0, -2.0, 3.0])
    params = {"x": jnp.zeros(3)}
    tx = config.build(200)
    state = tx.init(params)
    loss = lambda p: jnp.sum((p["x"] - target) ** 2)
    for _ in range(200):
        updates, state = tx.update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, updates)
    assert float(loss(params)) < 1e-2


def test_clipping_bounds_the_update():
    params = {"x": jnp.zeros(4)}
    sgd_like = AdamConfig(1.0, max_grad_norm=1.0, lr_schedule="constant", beta1=0.0, beta2=0.0)
    clipped = optax.chain(sgd_like._clipping())
    out, _ = clipped.update({"x": jnp.full(4, 100.0)}, clipped.init(params))
    assert float(optax.tree.norm(out)) == pytest.approx(1.0, rel=1e-5)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("cls", "kwargs", "named"),
    [
        (AdamConfig, dict(learning_rate=NAN), "learning_rate"),
        (AdamConfig, dict(learning_rate=INF), "learning_rate"),
        (AdamConfig, dict(learning_rate=0.0), "learning_rate"),
        (AdamConfig, dict(learning_rate=-1e-3), "learning_rate"),
        (AdamConfig, dict(learning_rate=True), "learning_rate"),
        (AdamConfig, dict(learning_rate="3e-4"), "learning_rate"),
        (AdamConfig, dict(learning_rate=1e-3, weight_decay=-0.1), "weight_decay"),
        (AdamConfig, dict(learning_rate=1e-3, weight_decay=NAN), "weight_decay"),
        (AdamConfig, dict(learning_rate=1e-3, beta1=1.0), "beta1"),
        (AdamConfig, dict(learning_rate=1e-3, beta2=-0.1), "beta2"),
        (AdamConfig, dict(learning_rate=1e-3, beta2=NAN), "beta2"),
        (AdamConfig, dict(learning_rate=1e-3, epsilon=0.0), "epsilon"),
        (AdamConfig, dict(learning_rate=1e-3, epsilon=NAN), "epsilon"),
        (AdamConfig, dict(learning_rate=1e-3, max_grad_norm=NAN), "max_grad_norm"),
        (AdamConfig, dict(learning_rate=1e-3, max_grad_norm=-1.0), "max_grad_norm"),
        (AdamConfig, dict(learning_rate=1e-3, warmup=NAN), "warmup"),
        (AdamConfig, dict(learning_rate=1e-3, warmup=-1), "warmup"),
        (AdamConfig, dict(learning_rate=1e-3, warmup=2.5), "warmup"),
        (AdamConfig, dict(learning_rate=1e-3, decay=INF), "decay"),
        (AdamConfig, dict(learning_rate=1e-3, min_lr_ratio=1.5), "min_lr_ratio"),
        (AdamConfig, dict(learning_rate=1e-3, lr_schedule="exponential"), "lr_schedule"),
        (LionConfig, dict(learning_rate=NAN), "learning_rate"),
        (LionConfig, dict(learning_rate=1e-4, beta1=1.5), "beta1"),
    ],
)
def test_hyperparameters_out_of_range_are_refused_when_the_config_is_made(cls, kwargs, named):
    with pytest.raises(OptimizerConfigError, match=named):
        cls(**kwargs)


def test_in_range_edge_values_are_accepted():
    AdamConfig(1e-3, 0.0, beta1=0.0, beta2=0.0, max_grad_norm=None, warmup=0, min_lr_ratio=1.0)
    AdamConfig(1e-3, warmup=0.5, decay=10, max_grad_norm=0.0)  # 0 turns clipping off
    LionConfig(1e-4, 1.0, beta1=0.0)


def test_schedule_errors_are_optimizer_config_errors():
    # One class to catch for any unusable optimizer setting, at declaration or when the run length is known.
    assert issubclass(ScheduleError, OptimizerConfigError)
    with pytest.raises(OptimizerConfigError, match="warmup"):
        AdamConfig(1e-3, warmup=500).lr_scheduler(100)
