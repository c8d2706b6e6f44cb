"""The trainer: microbatch equivalence, a short run end to end, metrics, eval, errors."""

import json
import os
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from levanter.data.batch import Batch
from levanter.models.llama import LlamaConfig
from levanter.models.loss import next_token_loss
from levanter.optim import AdamConfig
from levanter.trainer import (
    DataSourceError,
    MeshConfig,
    NonFiniteLossError,
    Trainer,
    TrainerConfig,
    TrainerConfigError,
    TrainState,
)
from levanter.trainer.data_feed import to_device
from levanter.trainer.sources import InMemoryWindows
from levanter.trainer.step import build_step_functions
from levanter.trainer.tracker import read_metrics

VOCAB = 64
SEQ = 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)


def tiny_model(key):
    return TINY.build(VOCAB, key=key)


def pattern_source(batch_size=8, seed=0):
    # A learnable stream (a repeating ramp) so a few steps visibly lower the loss.
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=batch_size, seed=seed)


# -- microbatching ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sgd_setup():
    """SGD with lr 1, so one step moves the parameters by exactly minus the gradient; one compiled
    step per microbatch count, shared by the tests."""
    params, static = eqx.partition(eqx.filter_jit(tiny_model)(jax.random.PRNGKey(0)), eqx.is_inexact_array)
    sgd = optax.sgd(1.0)

    def steps_for(num_microbatches):
        return build_step_functions(
            static_model=static,
            optimizer=sgd,
            lr_schedule=lambda step: 1.0,
            compute_dtype=jnp.float32,
            z_loss_weight=1e-3,
            num_microbatches=num_microbatches,
        ).train_step

    return params, static, sgd, {1: steps_for(1), 4: steps_for(4)}


def _one_sgd_step_gradient(setup, num_microbatches, batch):
    params, static, sgd, steps = setup
    state = TrainState(
        step=jnp.int32(0), params=jax.tree.map(jnp.copy, params), opt_state=sgd.init(params), key=jax.random.PRNGKey(1)
    )
    new_state, metrics = steps[num_microbatches](state, to_device(batch, None))  # donates `state`
    grads = jax.tree.map(lambda a, b: a - b, params, new_state.params)
    return grads, {k: float(v) for k, v in metrics.items()}


@pytest.fixture(scope="module")
def masked_batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(8, SEQ)).astype(np.int32)
    mask = (rng.random((8, SEQ)) < 0.6).astype(np.float32)
    mask[1] = 0.0  # a fully masked row and rows of very different weight: a mean of microbatch
    mask[6, :3] = 0.0  # means would weight them wrongly
    mask[:, -1] = 0.0
    return Batch(tokens=tokens, loss_mask=mask)


@pytest.mark.parametrize("use_mask", [False, True], ids=["all-tokens", "masked"])
def test_microbatches_give_the_full_batch_gradient(use_mask, masked_batch, sgd_setup):
    batch = masked_batch if use_mask else Batch.from_tokens(masked_batch.tokens)
    params, static = sgd_setup[0], sgd_setup[1]
    full, full_metrics = _one_sgd_step_gradient(sgd_setup, 1, batch)
    split, split_metrics = _one_sgd_step_gradient(sgd_setup, 4, batch)
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(split)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-7)
    assert split_metrics["loss"] == pytest.approx(full_metrics["loss"], rel=1e-5)
    assert split_metrics["loss_tokens"] == full_metrics["loss_tokens"] == batch.loss_mask[:, :-1].sum()

    # ...and both equal the gradient of the mean loss over the real tokens, written out directly.
    def reference(p):
        logits = eqx.combine(p, static).forward(jnp.asarray(batch.tokens)).logits
        loss_sum, weight, z_sum = next_token_loss(logits, jnp.asarray(batch.tokens), jnp.asarray(batch.loss_mask), z_loss_weight=1e-3)
        return (loss_sum + z_sum) / weight

    expected = jax.jit(jax.grad(reference))(params)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(split)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-7)


# -- a short run end to end ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = TrainerConfig(
        num_train_steps=24,
        batch_size=8,
        microbatch_size=4,
        eval_every=12,
        steps_per_checkpoint=8,
        keep_last_checkpoints=2,
        log_every=6,
        mesh=MeshConfig(data=1),
    )
    source = pattern_source()
    trainer = Trainer(config, AdamConfig(3e-3, 0.1, warmup=4), output_dir=str(out), flops_per_token=TINY.flops_per_token(VOCAB, SEQ))
    result = trainer.train(tiny_model, source, {"val": lambda: source.sequential_batches(limit=2)})
    return out, result


def test_loss_falls_and_eval_runs(short_run):
    _, result = short_run
    rows = [r for r in read_metrics(result.metrics_path) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 25))
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert result.final_train_loss == pytest.approx(rows[-1]["loss"])
    assert set(result.eval_losses) == {"val"} and math.isfinite(result.eval_losses["val"])
    assert result.eval_losses["val"] < math.log(VOCAB)


def test_metrics_jsonl_has_every_field(short_run):
    _, result = short_run
    records = read_metrics(result.metrics_path)
    step_rows = [r for r in records if "loss" in r]
    for key in ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_second", "mfu", "wall_time", "aux_loss"):
        assert key in step_rows[0], key
    assert step_rows[-1]["tokens"] == 24 * 8 * SEQ
    assert step_rows[0]["mfu"] is None  # no published peak for a CPU
    assert all(r["wall_time"] >= 0 for r in step_rows)
    assert step_rows[0]["lr"] == pytest.approx(3e-3 / 4, rel=1e-5)
    eval_rows = [r for r in records if "eval/val/loss" in r]
    assert [r["step"] for r in eval_rows] == [12, 24]
    json.dumps(records)  # strictly serialisable


def test_checkpoints_follow_the_keep_policy(short_run):
    _, result = short_run
    assert result.checkpoint_steps == [16, 24]  # every 8 steps, newest 2 kept


def test_rerun_of_a_finished_run_trains_nothing(short_run, tmp_path):
    out, result = short_run
    config = TrainerConfig(num_train_steps=24, batch_size=8, microbatch_size=4, mesh=MeshConfig(data=1))
    again = Trainer(config, AdamConfig(3e-3, 0.1, warmup=4), output_dir=str(out)).train(tiny_model, pattern_source())
    assert again.resumed_from == 24 and again.final_step == 24
    assert again.final_train_loss == pytest.approx(result.final_train_loss)
    for a, b in zip(jax.tree.leaves(again.state.params), jax.tree.leaves(result.state.params)):
        np.testing.assert_array_equal(a, b)


# -- errors ----------------------------------------------------------------------------------------


def plain_config():
    # The same settings as test_checkpoint's runs, so the compiled step is shared through the cache.
    return TrainerConfig(num_train_steps=8, batch_size=8, keep_last_checkpoints=None, log_every=2, mesh=MeshConfig(data=1))


def test_nan_loss_names_the_step(tmp_path):
    def poisoned(key):
        model = tiny_model(key)
        return eqx.tree_at(lambda m: m.final_norm.weight, model, jnp.full_like(model.final_norm.weight, jnp.nan))

    trainer = Trainer(plain_config(), AdamConfig(3e-3, 0.1, warmup=2), output_dir=str(tmp_path))
    with pytest.raises(NonFiniteLossError, match="at step 1"):
        trainer.train(poisoned, pattern_source())


def test_short_data_source_is_reported(tmp_path):
    class TwoBatches:
        def iter_from(self, start):
            source = pattern_source()
            return iter([source.batch_at(start), source.batch_at(start + 1)])

    trainer = Trainer(plain_config(), AdamConfig(3e-3, 0.1, warmup=2), output_dir=str(tmp_path))
    with pytest.raises(DataSourceError, match="ended after 2 batches"):
        trainer.train(tiny_model, TwoBatches())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(microbatch_size=3), "divisor"),
        (dict(trackers=("jsonl", "mlflow")), "mlflow"),
        (dict(compute_dtype="float8"), "float8"),
        (dict(num_train_steps=0), "positive"),
    ],
)
def test_bad_trainer_configs(kwargs, message):
    with pytest.raises(TrainerConfigError, match=message):
        TrainerConfig(**{"num_train_steps": 10, "batch_size": 8, **kwargs})


def test_mesh_larger_than_the_machine(tmp_path):
    with pytest.raises(TrainerConfigError, match="devices"):
        Trainer(TrainerConfig(num_train_steps=1, batch_size=8, mesh=MeshConfig(data=64)), AdamConfig(1e-3), output_dir=str(tmp_path))


def test_trainer_config_round_trips_through_json():
    config = TrainerConfig(num_train_steps=5, batch_size=4, mesh=MeshConfig(data=2, model=2), trackers=("jsonl", "tensorboard"))
    assert TrainerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


# -- MoE -------------------------------------------------------------------------------------------


def test_moe_model_trains_and_logs_its_aux_loss(tmp_path):
    from levanter.models.moe import MoeConfig

    moe = MoeConfig(
        hidden_dim=32, intermediate_dim=32, num_layers=2, num_heads=2, num_kv_heads=2,
        num_experts=4, num_experts_per_token=2, max_seq_len=SEQ,
    )
    config = TrainerConfig(num_train_steps=12, batch_size=8, log_every=4, mesh=MeshConfig(data=1))
    trainer = Trainer(config, AdamConfig(3e-3, 0.1, warmup=2), output_dir=str(tmp_path))
    result = trainer.train(lambda key: moe.build(VOCAB, key=key), pattern_source())
    rows = [r for r in read_metrics(result.metrics_path) if "loss" in r]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3
    aux = [r["aux_loss"] for r in rows]
    # Switch-style balance loss: coef * E * sum(f_i * p_i), about coef (0.01) per layer when balanced.
    assert all(0.0 < a < 1.0 for a in aux)
    assert aux[0] == pytest.approx(0.01 * moe.num_layers, rel=0.5)


# -- the entry point -------------------------------------------------------------------------------


def test_train_lm_writes_the_output_folder(tmp_path):
    from levanter.main.train_lm import TrainLmConfig, train_lm

    source = pattern_source(seed=9)
    config = TrainLmConfig(
        model=TINY,
        optimizer=AdamConfig(3e-3, 0.1, warmup=2),
        trainer=plain_config(),
        vocab_size=VOCAB,
        output_path=str(tmp_path / "run"),
    )
    json.dumps(config.to_dict())
    result = train_lm(config, source, {"validation": lambda: source.sequential_batches(limit=2)})
    assert result.final_step == 8
    assert os.path.exists(result.metrics_path)
    with open(result.eval_path) as f:
        record = json.load(f)
    assert record["step"] == 8 and record["eval"]["validation"] == pytest.approx(result.eval_losses["validation"])
    assert record["train_loss"] == pytest.approx(result.final_train_loss)
    assert result.checkpoint_paths == [os.path.join(result.checkpoint_dir, "8")]
    assert os.path.exists(os.path.join(result.hf_path, "config.json"))
    assert os.path.exists(os.path.join(result.hf_path, "model.safetensors"))
    json.dumps(result.to_dict())


# -- mixed precision and the peak-FLOPs table -------------------------------------------------------


def test_compute_dtype_policy_and_casting():
    from levanter.trainer import cast_floating, resolve_compute_dtype

    assert resolve_compute_dtype("auto", platform="cpu") == jnp.float32
    assert resolve_compute_dtype("auto", platform="gpu") == jnp.bfloat16
    assert resolve_compute_dtype("auto", platform="tpu") == jnp.bfloat16
    tree = {"w": jnp.ones((2, 2)), "ids": jnp.arange(3), "name": "x"}
    cast = cast_floating(tree, jnp.bfloat16)
    assert cast["w"].dtype == jnp.bfloat16 and cast["ids"].dtype == tree["ids"].dtype and cast["name"] == "x"


def test_peak_flops_table_and_mfu():
    from levanter.trainer import model_flops_utilization, peak_flops_per_device

    assert peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_per_device("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_per_device("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops_per_device("TPU v5 lite") == 197e12
    assert peak_flops_per_device("TPU v4") == 275e12
    assert peak_flops_per_device("Some Unknown Chip") is None
    assert peak_flops_per_device() is None  # the CPU the tests run on
    assert model_flops_utilization(1e9, 1e5, 2, 1e14) == pytest.approx(0.5)
    assert model_flops_utilization(1e9, 1e5, 1, None) is None


# -- trackers --------------------------------------------------------------------------------------


def test_jsonl_tracker_writes_strict_json(tmp_path):
    from levanter.trainer.tracker import build_trackers

    trackers = build_trackers(["jsonl"], metrics_path=str(tmp_path / "m.jsonl"), log_dir=str(tmp_path))
    trackers.log(3, {"loss": float("nan"), "mfu": None, "lr": 0.5})
    trackers.close()
    assert read_metrics(str(tmp_path / "m.jsonl")) == [{"step": 3, "loss": None, "mfu": None, "lr": 0.5}]


@pytest.mark.parametrize("name, module", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_optional_trackers_explain_a_missing_package(name, module, tmp_path):
    import importlib.util

    from levanter.trainer.tracker import TrackerUnavailableError, build_trackers

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    with pytest.raises(TrackerUnavailableError, match=f"pip install {module}"):
        build_trackers(["jsonl", name], metrics_path=str(tmp_path / "m.jsonl"), log_dir=str(tmp_path))
